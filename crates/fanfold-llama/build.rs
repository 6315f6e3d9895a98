//! Builds llama.cpp's JSON-Schema-to-grammar converter from the sources of
//! the llama.cpp that `llama-cpp-sys-2` just built, so the rest of its
//! `common` library need not be compiled.

use std::error::Error;
use std::path::{Path, PathBuf};

/// The converter and what it needs: the JSON value type, the schema model,
/// a trie and UTF-8 helpers.
const CONVERTER_SOURCES: [&str; 5] = [
    "json-schema-to-grammar.cpp",
    "json-schema.cpp",
    "json.cpp",
    "trie.cpp",
    "unicode.cpp",
];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=cpp/schema_grammar.cpp");
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_GGML_CMAKE_DIR");
    let llama = llama_source_dir()?;
    let common = llama.join("common");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .warnings(false)
        .include(&common)
        .include(llama.join("include"))
        .include(llama.join("ggml/include"))
        .include(llama.join("vendor"))
        .file("cpp/schema_grammar.cpp");
    for source in CONVERTER_SOURCES {
        build.file(common.join(source));
    }
    build.compile("fanfold_schema_grammar");
    Ok(())
}

/// The sys crate exports where it installed ggml's CMake package
/// (`<out>/lib/cmake`); the CMake cache beside it (`<out>/build`) names the
/// llama.cpp source tree it was configured from.
fn llama_source_dir() -> Result<PathBuf, Box<dyn Error>> {
    let cmake_dir = std::env::var("DEP_LLAMA_GGML_CMAKE_DIR")
        .map_err(|_| "llama-cpp-sys-2 did not export DEP_LLAMA_GGML_CMAKE_DIR")?;
    let out = Path::new(&cmake_dir)
        .ancestors()
        .nth(2)
        .ok_or_else(|| format!("unexpected ggml CMake dir {cmake_dir}"))?;
    let cache_path = out.join("build").join("CMakeCache.txt");
    let cache = std::fs::read_to_string(&cache_path)
        .map_err(|e| format!("{}: {e}", cache_path.display()))?;
    let source = cache
        .lines()
        .find_map(|line| line.strip_prefix("CMAKE_HOME_DIRECTORY:INTERNAL="))
        .ok_or_else(|| format!("{}: no CMAKE_HOME_DIRECTORY", cache_path.display()))?;
    let source = PathBuf::from(source);
    if !source.join("common/json-schema-to-grammar.cpp").is_file() {
        return Err(format!("{}: no common/json-schema-to-grammar.cpp", source.display()).into());
    }
    Ok(source)
}
