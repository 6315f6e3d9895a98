// JSON Schema to GBNF through llama.cpp's own converter, without the rest of
// llama.cpp's `common` library (argument parsing, chat templates, downloads),
// which costs minutes of C++ build for the one function fanfold uses.
//
// The converter's sources come from the pinned llama.cpp that the sys crate
// builds; this file adds the three string helpers they call from
// `common.cpp`, and a C entry point that never lets an exception cross into
// Rust.

#include "json-schema-to-grammar.h"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

std::string string_join(const std::vector<std::string> & values, const std::string & separator) {
    std::string joined;
    for (size_t i = 0; i < values.size(); ++i) {
        if (i > 0) {
            joined += separator;
        }
        joined += values[i];
    }
    return joined;
}

std::vector<std::string> string_split(const std::string & str, const std::string & delimiter) {
    std::vector<std::string> parts;
    size_t start = 0;
    for (size_t at = str.find(delimiter); at != std::string::npos; at = str.find(delimiter, start)) {
        parts.push_back(str.substr(start, at - start));
        start = at + delimiter.size();
    }
    parts.push_back(str.substr(start));
    return parts;
}

std::string string_repeat(const std::string & str, size_t n) {
    std::string repeated;
    repeated.reserve(str.size() * n);
    for (size_t i = 0; i < n; ++i) {
        repeated += str;
    }
    return repeated;
}

static char * copy_out(const std::string & text) {
    char * out = static_cast<char *>(std::malloc(text.size() + 1));
    if (out) {
        std::memcpy(out, text.c_str(), text.size() + 1);
    }
    return out;
}

// Returns 0 and the grammar in `*out`, or 1 and the converter's message in
// `*out`. `*out` is allocated with malloc (NULL only when that failed) and is
// released with `fanfold_string_free`.
extern "C" int fanfold_json_schema_to_grammar(const char * schema_json, char ** out) {
    try {
        const auto schema = common_json::parse(schema_json);
        *out = copy_out(json_schema_to_grammar(schema, false));
        return 0;
    } catch (const std::exception & e) {
        *out = copy_out(e.what());
    } catch (...) {
        *out = copy_out("unknown error");
    }
    return 1;
}

extern "C" void fanfold_string_free(char * text) {
    std::free(text);
}
