//! Jump-forward: the text an answer's grammar allows in one way only.
//!
//! Much of a typed answer is not chosen at all. After `{` the grammar of a
//! fact allows only `"decision":"`; after the decision's value only
//! `","kind":"`; once the first tokens of a verbatim quote single out one
//! of the unit's sentences, the rest of the sentence and of the answer.
//! Decoding that one token per step spends a decode step per token on
//! bytes that are already known. [`Forced`] asks the grammar, a byte at a
//! time, which bytes it allows next: while exactly one is allowed and the
//! answer may not end there, that byte is forced.
//!
//! The caller uses it two ways, both exact. Where the forced text runs to
//! the answer's end, the answer is finished at once: greedy decoding could
//! write no other bytes. Where a choice follows it, the model's next choice
//! depends on how the text was split into tokens, so the text is drafted
//! into the slot's next batch and greedy decoding checks it there like any
//! draft.

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;

/// Most bytes of forced text looked ahead at once: a verbatim quote whose
/// first tokens singled out its sentence is forced to its end.
const MAX_FORCED_BYTES: usize = 512;

/// The grammar's probe: one token per single byte, and the end-of-generation
/// tokens.
pub struct Forced {
    /// `(byte, token)` for every byte that is a token of its own.
    bytes: Vec<(u8, LlamaToken)>,
    /// The tokens that end an answer.
    ends: Vec<LlamaToken>,
}

/// The text the grammar forces from here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ahead {
    pub text: Vec<u8>,
    /// Only the end of the answer is allowed after `text`.
    pub ends: bool,
}

/// What the grammar allows next.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Exactly one byte, and not the end.
    Byte(u8, LlamaToken),
    /// Only the end of the answer.
    End,
    /// A choice (or nothing the probe can see).
    Open,
}

impl Forced {
    /// The probe for `model`'s vocabulary: a scan of every token, once per
    /// loaded model.
    pub fn new(model: &LlamaModel) -> Forced {
        let vocab = model.vocab();
        let mut by_byte: [Option<LlamaToken>; 256] = [None; 256];
        let mut ends = Vec::new();
        for (token, piece) in model.tokens(false) {
            if vocab.is_eog(token) {
                ends.push(token);
                continue;
            }
            if vocab.is_control(token) {
                continue;
            }
            if let [b] = piece.as_slice()
                && let Some(slot) = by_byte.get_mut(*b as usize)
                && slot.is_none()
            {
                *slot = Some(token);
            }
        }
        let bytes = (0u8..=255)
            .zip(by_byte)
            .filter_map(|(b, t)| t.map(|t| (b, t)))
            .collect();
        Forced { bytes, ends }
    }

    /// The text `grammar` forces next, and whether the answer must end
    /// after it. Stops before the first byte that is not ASCII (a
    /// character's bytes split across tokens differently from one
    /// vocabulary to the next), and after [`MAX_FORCED_BYTES`].
    pub fn ahead(&self, grammar: &LlamaSampler) -> Ahead {
        let mut text = Vec::new();
        let mut probe = grammar.clone();
        while text.len() < MAX_FORCED_BYTES {
            match self.next(&mut probe) {
                Next::Byte(b, token) if b.is_ascii() => {
                    text.push(b);
                    probe.accept(token);
                }
                Next::End => return Ahead { text, ends: true },
                _ => break,
            }
        }
        Ahead { text, ends: false }
    }

    /// What `grammar` allows next, asked of one candidate per byte and per
    /// end token. Applying a grammar to candidates does not advance it.
    fn next(&self, grammar: &mut LlamaSampler) -> Next {
        let candidates = self
            .bytes
            .iter()
            .map(|(_, t)| *t)
            .chain(self.ends.iter().copied())
            .map(|t| LlamaTokenData::new(t, 0.0, 0.0))
            .collect();
        let mut probe = LlamaTokenDataArray::new(candidates, false);
        probe.apply_sampler(grammar);
        // A vocabulary may have several end tokens: any of them ends.
        let (ends, bytes): (Vec<LlamaToken>, Vec<LlamaToken>) = probe
            .data
            .iter()
            .filter(|d| d.logit().is_finite())
            .map(|d| d.id())
            .partition(|t| self.ends.contains(t));
        match (ends.is_empty(), bytes.as_slice()) {
            (false, []) => Next::End,
            (true, [token]) => match self.bytes.iter().find(|(_, t)| t == token) {
                Some((b, t)) => Next::Byte(*b, *t),
                None => Next::Open,
            },
            _ => Next::Open,
        }
    }
}
