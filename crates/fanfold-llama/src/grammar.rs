//! JSON Schema to GBNF, by llama.cpp's converter (built from `cpp/` by the
//! build script).

use std::ffi::{CStr, CString, c_char, c_int};

unsafe extern "C" {
    fn fanfold_json_schema_to_grammar(schema_json: *const c_char, out: *mut *mut c_char) -> c_int;
    fn fanfold_string_free(text: *mut c_char);
}

/// The GBNF grammar (root rule `root`) of the JSON values `schema` allows,
/// or the converter's message for a schema it cannot convert.
pub fn schema_to_grammar(schema: &serde_json::Value) -> Result<String, String> {
    let text = CString::new(schema.to_string()).map_err(|e| e.to_string())?;
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: `text` is NUL-terminated and outlives the call; the function
    // catches every C++ exception and writes a malloc'd string (or NULL) to
    // `out`, which is read once and freed once below.
    let status = unsafe { fanfold_json_schema_to_grammar(text.as_ptr(), &mut out) };
    if out.is_null() {
        return Err("out of memory converting a schema to a grammar".into());
    }
    // SAFETY: `out` is a NUL-terminated string the converter allocated.
    let message = unsafe { CStr::from_ptr(out) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: allocated by the converter with malloc, not yet freed.
    unsafe { fanfold_string_free(out) };
    if status == 0 {
        Ok(message)
    } else {
        Err(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_schema_becomes_a_grammar_with_its_choices() {
        let grammar = schema_to_grammar(&json!({
            "type": "object",
            "properties": {"decision": {"enum": ["blocker", "not_blocker"]}},
            "required": ["decision"]
        }))
        .unwrap();
        assert!(grammar.contains("root ::="), "{grammar}");
        assert!(grammar.contains(r#""\"blocker\"""#), "{grammar}");
        assert!(grammar.contains(r#""\"not_blocker\"""#), "{grammar}");
    }

    #[test]
    fn a_schema_it_cannot_convert_is_an_error_with_the_reason() {
        let err = schema_to_grammar(&json!({"$ref": "#/definitions/missing"})).unwrap_err();
        assert!(!err.is_empty());
        assert!(err.contains("missing"), "{err}");
    }
}
