//! Mistakes refused before any call is paid: specs, labels and inputs.

#[allow(unused_imports)]
use super::*;
