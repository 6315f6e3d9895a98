//! The deterministic prefilter: jq rules that keep, exclude (with a reason
//! code) or route each unit before any model sees it.

use fanfold_core::spec::{PrefilterAction, PrefilterRule};
use serde::{Deserialize, Serialize};

use crate::jq::{JqError, JqProgram, Site};

/// What the prefilter decided for one unit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Outcome {
    /// Goes to the default (first) stage.
    Keep {
        rule: Option<String>,
    },
    Exclude {
        rule: String,
        reason: String,
    },
    Route {
        rule: String,
        stage: String,
    },
}

impl Outcome {
    /// The stage the unit goes to, if any.
    pub fn stage<'a>(&'a self, default_stage: &'a str) -> Option<&'a str> {
        match self {
            Outcome::Keep { .. } => Some(default_stage),
            Outcome::Route { stage, .. } => Some(stage),
            Outcome::Exclude { .. } => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PrefilterError {
    #[error("prefilter rule `{rule}`: {source}")]
    Jq { rule: String, source: JqError },
    #[error("compiling the prefilter on a worker thread: {0}")]
    Thread(String),
    #[error("prefilter rule `{rule}`: action `route` needs `stage`")]
    MissingStage { rule: String },
    #[error("prefilter rule `{rule}` on unit {unit}: {source}")]
    Eval {
        rule: String,
        unit: String,
        source: JqError,
    },
}

struct CompiledRule {
    rule: PrefilterRule,
    program: JqProgram,
    /// How a runaway evaluation names the rule.
    site: String,
}

/// The compiled rule list. Compile once per thread (jq values are not Send).
pub struct Prefilter {
    rules: Vec<CompiledRule>,
}

impl Prefilter {
    pub fn compile(rules: &[PrefilterRule]) -> Result<Prefilter, PrefilterError> {
        let mut compiled = Vec::with_capacity(rules.len());
        for rule in rules {
            if rule.action == PrefilterAction::Route && rule.stage.is_none() {
                return Err(PrefilterError::MissingStage {
                    rule: rule.name.clone(),
                });
            }
            let program = JqProgram::compile(&rule.when).map_err(|source| PrefilterError::Jq {
                rule: rule.name.clone(),
                source,
            })?;
            compiled.push(CompiledRule {
                site: format!("prefilter rule `{}`", rule.name),
                rule: rule.clone(),
                program,
            });
        }
        Ok(Prefilter { rules: compiled })
    }

    /// Decides one unit. A rule that fails at run time (e.g. `.labels[]` on a
    /// unit without labels), or yields anything but a boolean or nothing (a
    /// string, a number, null), is an error naming the rule and the unit,
    /// not a silent exclusion.
    pub fn decide(&self, unit_id: &str, value: jaq_json::Val) -> Result<Outcome, PrefilterError> {
        Ok(match self.first_match(unit_id, value)? {
            Some(i) => self.outcome_of(Some(i)),
            None => Outcome::Keep { rule: None },
        })
    }

    /// The index of the rule that decides the unit; `None` when no rule
    /// matches (the unit is kept for the first stage).
    pub fn first_match(
        &self,
        unit_id: &str,
        value: jaq_json::Val,
    ) -> Result<Option<usize>, PrefilterError> {
        for (i, c) in self.rules.iter().enumerate() {
            let hit = c
                .program
                .test_bool(value.clone(), Site::new(&c.site, unit_id))
                .map_err(|source| PrefilterError::Eval {
                    rule: c.rule.name.clone(),
                    unit: unit_id.to_owned(),
                    source,
                })?;
            if hit {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    /// The outcome of the rule at `index` (`None`: no rule matched).
    pub fn outcome_of(&self, index: Option<usize>) -> Outcome {
        match index.and_then(|i| self.rules.get(i)) {
            Some(c) => fast::outcome(&c.rule),
            None => Outcome::Keep { rule: None },
        }
    }
}

/// The prefilter for records read by [`crate::partition::jsonl`].
///
/// Rules of the common shape (field paths compared with literals, joined by
/// `and`, `or` and `| not`) are evaluated on the record itself, without
/// building a jq value, using jaq's own comparison of values. Every other
/// rule, and every record on which such a rule would leave that shape (a
/// path into a string, say), goes through jaq on the full value, so the
/// decisions and errors are exactly those of [`Prefilter::decide`].
pub mod fast {
    use fanfold_core::spec::{PrefilterAction, PrefilterRule};
    use jaq_core::ValT;
    use jaq_core::ops::Cmp;
    use jaq_json::Val;

    use super::{Outcome, Prefilter, PrefilterError};
    use crate::jq::Site;
    use crate::partition::jsonl::{Record, Shape, ValueRef};

    /// Compile once per thread, like [`Prefilter`].
    pub struct RecordPrefilter {
        prefilter: Prefilter,
        /// The rules that can be evaluated on records directly.
        direct: Vec<Option<Expr>>,
    }

    impl RecordPrefilter {
        pub fn compile(rules: &[PrefilterRule]) -> Result<RecordPrefilter, PrefilterError> {
            let prefilter = Prefilter::compile(rules)?;
            let direct = rules.iter().map(|r| parse(&r.when)).collect();
            Ok(RecordPrefilter { prefilter, direct })
        }

        /// How many rules are evaluated without jq values.
        pub fn direct_rules(&self) -> usize {
            self.direct.iter().filter(|d| d.is_some()).count()
        }

        /// The compiled rules, for units that are not JSONL records.
        pub fn prefilter(&self) -> &Prefilter {
            &self.prefilter
        }

        /// The index of the deciding rule, as [`Prefilter::first_match`]
        /// on `record.to_val()`.
        pub fn first_match_index(
            &self,
            unit_id: &str,
            record: &Record,
        ) -> Result<Option<usize>, PrefilterError> {
            let mut value: Option<Val> = None;
            for (i, (c, direct)) in self.prefilter.rules.iter().zip(&self.direct).enumerate() {
                // Anything but a boolean is an error, which jaq words.
                let quick = direct
                    .as_ref()
                    .and_then(|e| e.eval(record.root()).ok())
                    .and_then(|out| out.as_bool());
                let hit = match quick {
                    Some(b) => b,
                    None => {
                        let v = value.get_or_insert_with(|| record.to_val()).clone();
                        c.program
                            .test_bool(v, Site::new(&c.site, unit_id))
                            .map_err(|source| PrefilterError::Eval {
                                rule: c.rule.name.clone(),
                                unit: unit_id.to_owned(),
                                source,
                            })?
                    }
                };
                if hit {
                    return Ok(Some(i));
                }
            }
            Ok(None)
        }

        /// Decides one unit, as [`Prefilter::decide`] on `record.to_val()`.
        pub fn decide(&self, unit_id: &str, record: &Record) -> Result<Outcome, PrefilterError> {
            Ok(match self.first_match(unit_id, record)? {
                Some(rule) => outcome(rule),
                None => Outcome::Keep { rule: None },
            })
        }

        /// The rule that decides the unit, `None` when no rule matches (the
        /// unit is kept). Unlike [`RecordPrefilter::decide`] it allocates
        /// nothing, which matters when millions of units are only counted.
        pub fn first_match(
            &self,
            unit_id: &str,
            record: &Record,
        ) -> Result<Option<&PrefilterRule>, PrefilterError> {
            let at = self.first_match_index(unit_id, record)?;
            Ok(at
                .and_then(|i| self.prefilter.rules.get(i))
                .map(|c| &c.rule))
        }
    }

    pub(crate) fn outcome(rule: &PrefilterRule) -> Outcome {
        let name = rule.name.clone();
        match rule.action {
            PrefilterAction::Keep => Outcome::Keep { rule: Some(name) },
            PrefilterAction::Exclude => Outcome::Exclude {
                reason: rule.reason.clone().unwrap_or_else(|| name.clone()),
                rule: name,
            },
            PrefilterAction::Route => Outcome::Route {
                stage: rule.stage.clone().unwrap_or_default(),
                rule: name,
            },
        }
    }

    enum Expr {
        /// `.a.b`; empty for `.`.
        Path(Vec<Vec<u8>>),
        Str(Vec<u8>),
        Lit(Val),
        Cmp(Box<Expr>, Cmp, Box<Expr>),
        And(Box<Expr>, Box<Expr>),
        Or(Box<Expr>, Box<Expr>),
        Not(Box<Expr>),
    }

    /// A value during evaluation; strings stay borrowed from the record.
    enum Operand<'a> {
        Str(&'a [u8]),
        Val(Val),
    }

    /// The record leaves the shape the direct evaluation covers; jaq decides.
    struct Outside;

    impl Operand<'_> {
        fn truthy(&self) -> bool {
            match self {
                Operand::Str(_) => true,
                Operand::Val(v) => v.as_bool(),
            }
        }

        /// The value when it is a boolean.
        fn as_bool(&self) -> Option<bool> {
            match self {
                Operand::Val(Val::Bool(b)) => Some(*b),
                _ => None,
            }
        }

        fn into_val(self) -> Val {
            match self {
                Operand::Str(s) => Val::utf8_str(s.to_vec()),
                Operand::Val(v) => v,
            }
        }
    }

    fn boolean<'a>(b: bool) -> Operand<'a> {
        Operand::Val(Val::Bool(b))
    }

    impl Expr {
        fn eval<'a>(&'a self, root: ValueRef<'a>) -> Result<Operand<'a>, Outside> {
            match self {
                Expr::Path(keys) => {
                    // `None` is null: indexing null gives null, as in jq.
                    let mut at = Some(root);
                    for key in keys {
                        if let Some(v) = at {
                            at = match v.shape() {
                                Shape::Obj => v.get(key),
                                Shape::Null => None,
                                _ => return Err(Outside),
                            };
                        }
                    }
                    let Some(v) = at else {
                        return Ok(Operand::Val(Val::Null));
                    };
                    Ok(match v.shape() {
                        Shape::Str(s) => Operand::Str(s),
                        Shape::Null => Operand::Val(Val::Null),
                        Shape::Bool(b) => Operand::Val(Val::Bool(b)),
                        Shape::Num(n) => Operand::Val(Val::Num(n)),
                        Shape::Arr | Shape::Obj => Operand::Val(v.to_val()),
                    })
                }
                Expr::Str(s) => Ok(Operand::Str(s)),
                Expr::Lit(v) => Ok(Operand::Val(v.clone())),
                Expr::Cmp(l, op, r) => {
                    let l = l.eval(root)?;
                    let r = r.eval(root)?;
                    Ok(boolean(match (l, r) {
                        // Byte order, which is how jaq orders text strings.
                        (Operand::Str(a), Operand::Str(b)) => op.run(&a, &b),
                        (l, r) => op.run(&l.into_val(), &r.into_val()),
                    }))
                }
                Expr::And(l, r) => Ok(boolean(l.eval(root)?.truthy() && r.eval(root)?.truthy())),
                Expr::Or(l, r) => Ok(boolean(l.eval(root)?.truthy() || r.eval(root)?.truthy())),
                Expr::Not(e) => Ok(boolean(!e.eval(root)?.truthy())),
            }
        }
    }

    #[derive(Debug, PartialEq)]
    enum Tok {
        Path(Vec<Vec<u8>>),
        Str(Vec<u8>),
        Num(String),
        Word(String),
        Cmp(&'static str),
        Open,
        Close,
        Pipe,
    }

    const WORDS: &[&str] = &["and", "or", "not", "true", "false", "null"];
    const KEYWORDS: &[&str] = &[
        "and", "or", "not", "if", "then", "elif", "else", "end", "as", "def", "reduce", "foreach",
        "try", "catch", "label", "import", "include", "__loc__",
    ];

    fn ident_start(b: u8) -> bool {
        b.is_ascii_alphabetic() || b == b'_'
    }

    fn ident(b: u8) -> bool {
        b.is_ascii_alphanumeric() || b == b'_'
    }

    /// Tokens of the covered subset; `None` for anything else.
    fn tokens(src: &str) -> Option<Vec<Tok>> {
        let b = src.as_bytes();
        let at = |i: usize| b.get(i).copied();
        let mut out = Vec::new();
        let mut i = 0;
        while let Some(c) = at(i) {
            if c.is_ascii_whitespace() {
                i += 1;
                continue;
            }
            match c {
                b'.' => {
                    let mut keys = Vec::new();
                    i += 1;
                    while at(i).is_some_and(ident_start) {
                        let start = i;
                        while at(i).is_some_and(ident) {
                            i += 1;
                        }
                        let name = &src[start..i];
                        if KEYWORDS.contains(&name) {
                            return None;
                        }
                        keys.push(name.as_bytes().to_vec());
                        if at(i) == Some(b'.') && at(i + 1).is_some_and(ident_start) {
                            i += 1;
                        }
                    }
                    if matches!(at(i), Some(b'.' | b'[' | b'?' | b'"')) {
                        return None;
                    }
                    out.push(Tok::Path(keys));
                }
                b'"' => {
                    let start = i + 1;
                    let mut j = start;
                    loop {
                        match at(j)? {
                            b'"' => break,
                            b'\\' => return None,
                            c if c < 0x20 => return None,
                            _ => j += 1,
                        }
                    }
                    out.push(Tok::Str(b.get(start..j)?.to_vec()));
                    i = j + 1;
                }
                b'0'..=b'9' => {
                    let start = i;
                    while at(i).is_some_and(|c| c.is_ascii_digit()) {
                        i += 1;
                    }
                    if at(i) == Some(b'.') {
                        i += 1;
                        if !at(i).is_some_and(|c| c.is_ascii_digit()) {
                            return None;
                        }
                        while at(i).is_some_and(|c| c.is_ascii_digit()) {
                            i += 1;
                        }
                    }
                    if at(i).is_some_and(|c| ident(c) || c == b'.') {
                        return None;
                    }
                    out.push(Tok::Num(src[start..i].to_owned()));
                }
                b'(' | b')' => {
                    out.push(if c == b'(' { Tok::Open } else { Tok::Close });
                    i += 1;
                }
                b'|' => {
                    if matches!(at(i + 1), Some(b'=' | b'|')) {
                        return None;
                    }
                    out.push(Tok::Pipe);
                    i += 1;
                }
                b'=' | b'!' | b'<' | b'>' => {
                    let two = at(i + 1) == Some(b'=');
                    let op = match (c, two) {
                        (b'=', true) => "==",
                        (b'!', true) => "!=",
                        (b'<', true) => "<=",
                        (b'>', true) => ">=",
                        (b'<', false) => "<",
                        (b'>', false) => ">",
                        _ => return None,
                    };
                    out.push(Tok::Cmp(op));
                    i += if two { 2 } else { 1 };
                }
                c if ident_start(c) => {
                    let start = i;
                    while at(i).is_some_and(ident) {
                        i += 1;
                    }
                    let word = &src[start..i];
                    if !WORDS.contains(&word) || matches!(at(i), Some(b':' | b'(')) {
                        return None;
                    }
                    out.push(Tok::Word(word.to_owned()));
                }
                _ => return None,
            }
        }
        Some(out)
    }

    /// The rule's expression when it lies inside the covered subset.
    fn parse(src: &str) -> Option<Expr> {
        let toks = tokens(src)?;
        let mut p = Parser { toks: &toks, at: 0 };
        let e = p.pipe()?;
        (p.at == toks.len()).then_some(e)
    }

    struct Parser<'t> {
        toks: &'t [Tok],
        at: usize,
    }

    impl Parser<'_> {
        fn peek(&self) -> Option<&Tok> {
            self.toks.get(self.at)
        }

        fn word(&mut self, w: &str) -> bool {
            if matches!(self.peek(), Some(Tok::Word(x)) if x == w) {
                self.at += 1;
                true
            } else {
                false
            }
        }

        fn pipe(&mut self) -> Option<Expr> {
            let mut e = self.or()?;
            while self.peek() == Some(&Tok::Pipe) {
                self.at += 1;
                if !self.word("not") {
                    return None;
                }
                e = Expr::Not(Box::new(e));
            }
            Some(e)
        }

        fn or(&mut self) -> Option<Expr> {
            let mut e = self.and()?;
            while self.word("or") {
                e = Expr::Or(Box::new(e), Box::new(self.and()?));
            }
            Some(e)
        }

        fn and(&mut self) -> Option<Expr> {
            let mut e = self.cmp()?;
            while self.word("and") {
                e = Expr::And(Box::new(e), Box::new(self.cmp()?));
            }
            Some(e)
        }

        fn cmp(&mut self) -> Option<Expr> {
            let l = self.term()?;
            let op = match self.peek() {
                Some(Tok::Cmp(op)) => match *op {
                    "==" => Cmp::Eq,
                    "!=" => Cmp::Ne,
                    "<" => Cmp::Lt,
                    "<=" => Cmp::Le,
                    ">" => Cmp::Gt,
                    _ => Cmp::Ge,
                },
                _ => return Some(l),
            };
            self.at += 1;
            let r = self.term()?;
            if matches!(self.peek(), Some(Tok::Cmp(_))) {
                return None;
            }
            Some(Expr::Cmp(Box::new(l), op, Box::new(r)))
        }

        fn term(&mut self) -> Option<Expr> {
            let tok = self.toks.get(self.at)?;
            self.at += 1;
            Some(match tok {
                Tok::Path(keys) => Expr::Path(keys.clone()),
                Tok::Str(s) => Expr::Str(s.clone()),
                // A literal becomes the value jaq makes of it.
                Tok::Num(n) => Expr::Lit(Val::from_num(n).ok()?),
                Tok::Word(w) => match w.as_str() {
                    "true" => Expr::Lit(Val::Bool(true)),
                    "false" => Expr::Lit(Val::Bool(false)),
                    "null" => Expr::Lit(Val::Null),
                    _ => return None,
                },
                Tok::Open => {
                    let e = self.pipe()?;
                    if self.peek() != Some(&Tok::Close) {
                        return None;
                    }
                    self.at += 1;
                    e
                }
                Tok::Close | Tok::Pipe | Tok::Cmp(_) => return None,
            })
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        const RECORDS: &[&str] = &[
            r#"{"id": 1, "level": "ERROR", "latency_ms": 900, "user": {"country": "DE"}, "msg": "x", "n": 1.5, "flag": true, "tags": ["a", "b"]}"#,
            r#"{"id": 2, "level": "INFO", "latency_ms": 12, "user": {"country": "US"}, "msg": "y", "n": 1, "flag": false, "tags": []}"#,
            r#"{"id": 3, "level": "WARN", "latency_ms": 501.5, "user": null, "n": 18446744073709551615, "a": "b", "b": "a"}"#,
            r#"{"id": 4, "level": 5, "latency_ms": "900", "user": {"country": ["DE"]}, "n": -3, "flag": null}"#,
            r#"{"id": 5, "level": "ERROR", "level": "INFO", "latency_ms": 500}"#,
            r#"[1, 2]"#,
        ];

        const EXPRESSIONS: &[(&str, bool)] = &[
            (r#".level == "ERROR" and .latency_ms > 500"#, true),
            (r#"(.level == "ERROR" and .latency_ms > 500) | not"#, true),
            (r#".user.country == "DE" or .latency_ms <= 12"#, true),
            (r#".missing == null and .missing.deeper != 1"#, true),
            (r#".msg.x == 1"#, true),
            (r#".a < .b or .a >= "b""#, true),
            (r#".tags == .tags and .user > 1"#, true),
            (r#".level > 5 and .n >= 1.5"#, true),
            (r#".n == 1.0 or .n < 0 or .n == 18446744073709551615"#, true),
            (r#".flag"#, true),
            (r#".flag | not | not"#, true),
            (r#"true and null or false"#, true),
            (r#""a" < "b" and 2 > 10 | not"#, true),
            (r#".tags | length > 1"#, false),
            (r#".level | test("ERR")"#, false),
            (r#".["level"] == "ERROR""#, false),
            (r#".level == "ERR\u004fR""#, false),
            (r#".latency_ms > -1"#, false),
        ];

        #[test]
        fn decisions_and_errors_match_jaq() {
            for (when, direct) in EXPRESSIONS {
                for action in [PrefilterAction::Exclude, PrefilterAction::Keep] {
                    let rules = [PrefilterRule {
                        name: "r".into(),
                        when: (*when).into(),
                        action,
                        reason: None,
                        stage: None,
                    }];
                    let fast = RecordPrefilter::compile(&rules).expect("compiles");
                    assert_eq!(fast.direct_rules(), usize::from(*direct), "{when}");
                    let slow = Prefilter::compile(&rules).expect("compiles");
                    for text in RECORDS {
                        let mut record = Record::default();
                        record.parse(text.as_bytes()).expect("parses");
                        let want = slow.decide("u", record.to_val()).map_err(|e| e.to_string());
                        let got = fast.decide("u", &record).map_err(|e| e.to_string());
                        assert_eq!(got, want, "{when} on {text}");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jq::to_val;
    use serde_json::json;

    fn rule(name: &str, when: &str, action: PrefilterAction) -> PrefilterRule {
        PrefilterRule {
            name: name.into(),
            when: when.into(),
            action,
            reason: None,
            stage: if action == PrefilterAction::Route {
                Some("deep".into())
            } else {
                None
            },
        }
    }

    #[test]
    fn first_matching_rule_decides() {
        let pf = Prefilter::compile(&[
            rule("closed", r#".state == "CLOSED""#, PrefilterAction::Exclude),
            rule("long", ".body | length > 10", PrefilterAction::Route),
        ])
        .expect("compiles");
        let closed = json!({"state": "CLOSED", "body": "a very long body"});
        assert_eq!(
            pf.decide("1", to_val(&closed)).expect("ok"),
            Outcome::Exclude {
                rule: "closed".into(),
                reason: "closed".into()
            }
        );
        let long = json!({"state": "OPEN", "body": "a very long body"});
        assert_eq!(
            pf.decide("2", to_val(&long)).expect("ok").stage("main"),
            Some("deep")
        );
        let short = json!({"state": "OPEN", "body": "short"});
        assert_eq!(
            pf.decide("3", to_val(&short)).expect("ok"),
            Outcome::Keep { rule: None }
        );
    }

    #[test]
    fn errors_name_the_rule_and_unit() {
        let err = Prefilter::compile(&[rule("bad", ".state ==", PrefilterAction::Keep)])
            .err()
            .expect("fails");
        assert!(err.to_string().contains("`bad`"), "{err}");
        let pf = Prefilter::compile(&[rule(
            "labels",
            ".labels[] | .name == \"x\"",
            PrefilterAction::Keep,
        )])
        .expect("ok");
        let err = pf
            .decide("42", to_val(&json!({"labels": 3})))
            .expect_err("fails");
        assert!(err.to_string().contains("unit 42"), "{err}");
    }

    #[test]
    fn a_rule_yielding_no_boolean_is_an_error_not_a_miss() {
        let record = br#"{"id": 7, "level": "ERROR", "n": 3, "flag": true}"#;
        for when in [".level", ".n", ".missing", r#""yes""#, "{}"] {
            let rules = [rule("odd", when, PrefilterAction::Exclude)];
            let slow = Prefilter::compile(&rules).expect("compiles");
            let mut parsed = crate::partition::jsonl::Record::default();
            parsed.parse(record).expect("parses");
            let err = slow
                .decide("7", parsed.to_val())
                .expect_err(when)
                .to_string();
            assert!(err.contains("`odd`") && err.contains("unit 7"), "{err}");
            assert!(err.contains("not a boolean"), "{err}");
            let fast = fast::RecordPrefilter::compile(&rules).expect("compiles");
            let got = fast.decide("7", &parsed).expect_err(when).to_string();
            assert_eq!(got, err, "{when}");
        }
        // A boolean decides, and no output is no match.
        for (when, excluded) in [(".flag", true), (".n > 5", false), ("empty", false)] {
            let pf =
                Prefilter::compile(&[rule("r", when, PrefilterAction::Exclude)]).expect("compiles");
            let out = pf
                .decide("7", to_val(&json!({"flag": true, "n": 3})))
                .expect(when);
            assert_eq!(matches!(out, Outcome::Exclude { .. }), excluded, "{when}");
        }
    }
}
