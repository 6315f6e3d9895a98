//! Evidence quotes on real text: every field with text offers quotable
//! spans, whatever its punctuation.

#[allow(unused_imports)]
use super::*;
