//! Real files: repeated rows, unterminated quotes, ids that only look alike.

#[allow(unused_imports)]
use super::*;
