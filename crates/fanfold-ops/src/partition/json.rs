//! JSON records as the partition reads them: a value exactly as
//! `serde_json::Value` reads it, noticing an object that holds one field
//! name twice (which `Value` silently settles by keeping the last); and a
//! key field's digits read from the record's own text when they are an
//! integer too large for a 64-bit number, which `Value` holds as a float
//! (so `18446744073709551616` and `18446744073709551617` would be one id).

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Parses one JSON text into the `Value` `serde_json::from_slice` gives,
/// with the first field name an object repeats, in the order the parser
/// meets it (a field's value is read before its name is checked), if any.
pub(super) fn parse_value(bytes: &[u8]) -> Result<(Value, Option<String>), serde_json::Error> {
    let mut repeated = None;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Checked(&mut repeated).deserialize(&mut de)?;
    de.end()?;
    Ok((value, repeated))
}

/// Builds a `Value` as `Value`'s own visitor does, noting the first
/// repeated field name.
struct Checked<'r>(&'r mut Option<String>);

impl<'de> DeserializeSeed<'de> for Checked<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Checked<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(Checked(&mut *self.0))? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            let value = access.next_value_seed(Checked(&mut *self.0))?;
            // `insert` keeps the first position and the last value, as
            // `Value` does; the record is rejected anyway.
            if map.insert(key.clone(), value).is_some() && self.0.is_none() {
                *self.0 = Some(key);
            }
        }
        Ok(Value::Object(map))
    }
}

/// The digits of the integer the top-level object's `key` field holds,
/// from the record's own text, when that integer is written without a
/// fraction or exponent (a float field keeps `Value`'s text). Only called
/// for a key `Value` reads as a float, which is rare.
pub(super) fn integer_key_text(record: &[u8], key: &str) -> Option<String> {
    let token = top_level_field(record, key)?;
    let digits = token.strip_prefix(b"-").unwrap_or(token);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    String::from_utf8(token.to_vec()).ok()
}

/// The text of the value of the top-level object's last `key` field, as
/// the record has it. Names are compared after unescaping.
fn top_level_field<'a>(record: &'a [u8], key: &str) -> Option<&'a [u8]> {
    let ws = |mut i: usize| {
        while record.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        i
    };
    let mut i = ws(0);
    if record.get(i) != Some(&b'{') {
        return None;
    }
    let mut found = None;
    loop {
        i = ws(i + 1);
        if record.get(i) != Some(&b'"') {
            return found;
        }
        let name_end = scan_value(record, i).ok()?;
        let name = record.get(i..name_end)?;
        let matches = if name.contains(&b'\\') {
            serde_json::from_slice::<String>(name).ok()? == key
        } else {
            name.get(1..name.len() - 1)? == key.as_bytes()
        };
        i = ws(name_end);
        if record.get(i) != Some(&b':') {
            return found;
        }
        let start = ws(i + 1);
        let end = scan_value(record, start).ok()?;
        if matches {
            found = Some(record.get(start..end)?.trim_ascii_end());
        }
        i = ws(end);
        if record.get(i) != Some(&b',') {
            return found;
        }
    }
}

/// The id a JSON record's key field gives: its scalar, with an integer too
/// large for 64 bits read from the record's own text.
pub(super) fn record_key_id(value: &Value, record: &[u8], key: &str) -> Option<String> {
    match value.get(key)? {
        Value::Number(n) if n.is_f64() => {
            Some(integer_key_text(record, key).unwrap_or_else(|| n.to_string()))
        }
        v => super::assign::scalar_id(Some(v)),
    }
}

/// The end of the JSON value starting at `start`: strings, nesting and
/// escapes are tracked; the value itself is validated by serde afterwards.
pub(super) fn scan_value(bytes: &[u8], start: usize) -> Result<usize, (usize, &'static str)> {
    let mut depth = 0usize;
    let mut in_string = false;
    // The byte after a backslash in a string is taken as it is.
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate().skip(start) {
        if escaped {
            escaped = false;
        } else if in_string {
            match b {
                b'\\' => escaped = true,
                b'"' => {
                    in_string = false;
                    if depth == 0 {
                        return Ok(i + 1);
                    }
                }
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'{' | b'[' => depth += 1,
                b'}' | b']' => {
                    if depth == 0 {
                        return Ok(i);
                    }
                    depth -= 1;
                    if depth == 0 {
                        return Ok(i + 1);
                    }
                }
                b',' if depth == 0 => return Ok(i),
                _ => {}
            }
        }
    }
    if in_string {
        Err((start, "a string is not closed (truncated input?)"))
    } else if depth > 0 {
        Err((start, "an element is not closed (truncated input?)"))
    } else {
        Ok(bytes.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_as_serde_reads_them_and_repeats_are_named() {
        for text in [
            r#"{"a": 1, "b": [1, 2.5, -3, null, true, "x"], "c": {"d": {}}}"#,
            r#"[18446744073709551616, 1e3, -0, "caf\u00e9"]"#,
            "\"\"",
        ] {
            let (value, repeated) = parse_value(text.as_bytes()).expect("parses");
            let want: Value = serde_json::from_str(text).expect("json");
            assert_eq!(value, want, "{text}");
            assert_eq!(repeated, None);
        }
        let named = |text: &str| parse_value(text.as_bytes()).expect("parses").1;
        assert_eq!(named(r#"{"id": 1, "id": 2}"#).as_deref(), Some("id"));
        // Spelled differently, one name.
        assert_eq!(named(r#"{"a": 1, "\u0061": 2}"#).as_deref(), Some("a"));
        // A nested object's repeat is met before its parent's.
        assert_eq!(
            named(r#"{"x": 1, "y": {"z": 1, "z": 2}, "x": 3}"#).as_deref(),
            Some("z")
        );
        assert_eq!(named(r#"[{"k": 1}, {"k": 2}]"#), None);
    }

    #[test]
    fn integer_keys_keep_their_digits() {
        let key = |text: &str| integer_key_text(text.as_bytes(), "id");
        assert_eq!(
            key(r#"{"id": 18446744073709551617, "t": "x"}"#).as_deref(),
            Some("18446744073709551617")
        );
        assert_eq!(
            key(r#" { "n": {"id": 1}, "i\u0064" : -18446744073709551617 } "#).as_deref(),
            Some("-18446744073709551617")
        );
        assert_eq!(key(r#"{"id": 1.5}"#), None);
        assert_eq!(key(r#"{"id": 1e30}"#), None);
        assert_eq!(key(r#"{"other": 1}"#), None);
        assert_eq!(key(r#"[1]"#), None);
    }
}
