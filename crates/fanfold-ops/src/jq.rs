//! jq expressions (through jaq), as users of `gh --jq` write them.

use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Compiler, Ctx, Vars, data};
use jaq_json::Val;

type Data = data::JustLut<Val>;

/// A compiled jq program. Not `Send`: jaq values are reference-counted, so
/// each thread compiles its own copy.
pub struct JqProgram {
    source: String,
    filter: jaq_core::compile::Filter<jaq_core::Native<Data>>,
}

#[derive(Debug, thiserror::Error)]
pub enum JqError {
    #[error("jq syntax error in `{expr}`: {detail}")]
    Syntax { expr: String, detail: String },
    #[error("jq error in `{expr}`: {detail}")]
    Runtime { expr: String, detail: String },
}

impl JqProgram {
    pub fn compile(source: &str) -> Result<JqProgram, JqError> {
        let defs = jaq_core::defs()
            .chain(jaq_std::defs())
            .chain(jaq_json::defs());
        let funs = jaq_core::funs()
            .chain(jaq_std::funs())
            .chain(jaq_json::funs());
        let loader = Loader::new(defs);
        let arena = Arena::default();
        let syntax = |detail: String| JqError::Syntax {
            expr: excerpt(source),
            detail,
        };
        let modules = loader
            .load(
                &arena,
                File {
                    code: source,
                    path: (),
                },
            )
            .map_err(|errs| {
                syntax(
                    errs.into_iter()
                        .map(|(_, e)| describe_load_error(source, e))
                        .collect::<Vec<_>>()
                        .join("; "),
                )
            })?;
        let filter = Compiler::default()
            .with_funs(funs)
            .compile(modules)
            .map_err(|errs| {
                let names: Vec<String> = errs
                    .into_iter()
                    .flat_map(|(_, es)| {
                        es.into_iter()
                            .map(|(name, undef)| format!("{name} ({undef:?})"))
                    })
                    .collect();
                syntax(format!("undefined: {}", names.join(", ")))
            })?;
        Ok(JqProgram {
            source: source.to_owned(),
            filter,
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Every output of the program on `input`.
    pub fn run(&self, input: Val) -> Result<Vec<Val>, JqError> {
        let ctx = Ctx::<Data>::new(&self.filter.lut, Vars::new([]));
        let mut out = Vec::new();
        for item in self.filter.id.run((ctx, input)) {
            match item {
                Ok(v) => out.push(v),
                Err(exn) => {
                    let detail = match exn.get_err() {
                        Ok(e) => e.to_string(),
                        Err(_) => "the program halted".to_owned(),
                    };
                    return Err(JqError::Runtime {
                        expr: excerpt(&self.source),
                        detail,
                    });
                }
            }
        }
        Ok(out)
    }

    /// True when the first output is `true`; jq's `select` semantics.
    /// The program's first output, if any. Later outputs are never
    /// computed: a generator such as `repeat(false)` is asked for one value.
    pub fn first(&self, input: Val) -> Result<Option<Val>, JqError> {
        let ctx = Ctx::<Data>::new(&self.filter.lut, Vars::new([]));
        match self.filter.id.run((ctx, input)).next() {
            None => Ok(None),
            Some(Ok(v)) => Ok(Some(v)),
            Some(Err(exn)) => Err(JqError::Runtime {
                expr: excerpt(&self.source),
                detail: match exn.get_err() {
                    Ok(e) => e.to_string(),
                    Err(_) => "the program halted".to_owned(),
                },
            }),
        }
    }

    pub fn test(&self, input: Val) -> Result<bool, JqError> {
        Ok(matches!(self.first(input)?, Some(Val::Bool(true))))
    }

    /// The first output as JSON.
    pub fn first_json(&self, input: Val) -> Result<Option<serde_json::Value>, JqError> {
        match self.first(input)? {
            None => Ok(None),
            Some(v) => {
                serde_json::from_str(&v.to_string())
                    .map(Some)
                    .map_err(|e| JqError::Runtime {
                        expr: self.source.clone(),
                        detail: format!("output is not JSON: {e}"),
                    })
            }
        }
    }
}

/// A short form of a program for error messages: long scripts are named by
/// their first line.
/// Where `at` (a slice of `source`) starts, as a person counts: line and
/// column, or "the end".
fn position(source: &str, at: &str) -> String {
    let offset = (at.as_ptr() as usize).wrapping_sub(source.as_ptr() as usize);
    if offset >= source.len() {
        return "the end".to_owned();
    }
    let before = &source[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {column}")
}

/// A jq load error in words, with where it happened.
fn describe_load_error(source: &str, e: jaq_core::load::Error<&str>) -> String {
    use jaq_core::load::{Error, lex};
    let mut out = Vec::new();
    match e {
        Error::Io(v) => out.extend(v.into_iter().map(|(path, msg)| format!("{path}: {msg}"))),
        Error::Lex(v) => {
            for (expect, at) in v {
                out.push(match expect {
                    lex::Expect::Delim(open) => {
                        format!("`{open}` at {} is never closed", position(source, open))
                    }
                    other => format!("expected {} at {}", other.as_str(), position(source, at)),
                });
            }
        }
        Error::Parse(v) => {
            for (expect, found) in v {
                let at = position(source, found);
                let shown: String = found.chars().take(20).collect();
                let got = if shown.is_empty() {
                    "nothing".to_owned()
                } else {
                    format!("`{shown}`")
                };
                out.push(format!("expected {} at {at}, found {got}", expect.as_str()));
            }
        }
    }
    out.join("; ")
}

fn excerpt(source: &str) -> String {
    let first = source
        .lines()
        .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .unwrap_or("");
    if first.len() < source.trim().len() {
        format!("{} ...", first.chars().take(80).collect::<String>())
    } else {
        source.to_owned()
    }
}

/// A serde_json value as a jq value.
pub fn to_val(value: &serde_json::Value) -> Val {
    use serde::Deserialize;
    Val::deserialize(value).unwrap_or_default()
}

/// Raw JSON bytes as a jq value, without building a serde value first.
pub fn parse_val(bytes: &[u8]) -> Result<Val, String> {
    jaq_json::read::parse_single(bytes).map_err(|e| format!("{e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn syntax_errors_say_where() {
        let err = JqProgram::compile(".x == (1 +")
            .err()
            .expect("fails")
            .to_string();
        assert!(
            err.contains("`(` at line 1, column 7 is never closed"),
            "{err}"
        );
        let err = JqProgram::compile(".a |\n  if . then 1")
            .err()
            .expect("fails")
            .to_string();
        assert!(err.contains("expected else or end at the end"), "{err}");
        let err = JqProgram::compile(".a |\n  .b ]")
            .err()
            .expect("fails")
            .to_string();
        assert!(err.contains("line 2, column 6"), "{err}");
        assert!(!err.contains("Parse(") && !err.contains("Lex("), "{err}");
    }

    #[test]
    fn only_the_first_output_is_computed() {
        // Both generate without end; only their first value is asked for.
        for expr in ["repeat(false)", "limit(1e12; repeat(.))"] {
            let p = JqProgram::compile(expr).expect("compiles");
            assert!(!p.test(to_val(&json!(false))).expect("runs"));
        }
        let p = JqProgram::compile("range(1e12)").expect("compiles");
        assert_eq!(
            p.first_json(to_val(&json!(null))).expect("runs"),
            Some(json!(0))
        );
    }

    #[test]
    fn runs_gh_style_expressions() {
        let p = JqProgram::compile(r#".state == "OPEN" and any(.labels[]; .name == "bug")"#)
            .expect("compiles");
        let issue = json!({"state": "OPEN", "labels": [{"name": "bug"}]});
        assert!(p.test(to_val(&issue)).expect("runs"));
        let closed = json!({"state": "CLOSED", "labels": []});
        assert!(!p.test(to_val(&closed)).expect("runs"));
    }

    #[test]
    fn regex_functions_are_available() {
        let p = JqProgram::compile(r#".body | test("refresh token"; "i")"#).expect("compiles");
        assert!(
            p.test(to_val(&json!({"body": "The Refresh Token rotates"})))
                .expect("runs")
        );
    }

    #[test]
    fn syntax_errors_name_the_expression() {
        let err = JqProgram::compile(".state ==").err().expect("fails");
        assert!(err.to_string().contains(".state =="), "{err}");
        let err = JqProgram::compile("nosuchfn(1)").err().expect("fails");
        assert!(err.to_string().contains("nosuchfn"), "{err}");
    }

    #[test]
    fn first_json_round_trips() {
        let p = JqProgram::compile(r#"{decision: (if .n > 2 then "yes" else "no" end), n}"#)
            .expect("compiles");
        let out = p.first_json(to_val(&json!({"n": 3}))).expect("runs");
        assert_eq!(out, Some(json!({"decision": "yes", "n": 3})));
    }
}
