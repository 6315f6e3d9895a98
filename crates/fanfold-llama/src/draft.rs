//! Prompt-lookup drafting: guesses of the tokens a slot will emit next,
//! taken from text the model has already seen.
//!
//! Most of a typed answer is not chosen at all. The JSON between values
//! (`","evidence":[{"field":"`) repeats from one answer to the next, and a
//! verbatim quote is a copy of the unit's own tokens. So the drafter looks
//! up the last few tokens a slot emitted in the unit and in the job's last
//! finished answer, and proposes what followed them there. The caller
//! evaluates the drafts in the same batch as the slot's next input and keeps
//! the longest prefix that greedy decoding would have chosen anyway: a
//! wrong draft costs batch room, not a different choice. (A drafted batch
//! has another shape, and llama.cpp's CPU kernels are not bit-identical
//! across batch shapes, so a near tie can still fall the other way, as it
//! can when the slot count changes.)

/// Longest n-gram of the output that is looked up.
const MAX_NGRAM: usize = 3;
/// Shortest: one token matches too many places to be worth a guess.
const MIN_NGRAM: usize = 2;

/// Up to `max` tokens that followed the longest recent n-gram of `out`
/// (2 ≤ n ≤ 3) in the first source holding it; the earliest source wins a tie
/// of lengths, the latest occurrence wins within a source. An empty output
/// drafts the opening of `opening`, the job's last answer.
pub fn draft<T: Copy + PartialEq>(
    out: &[T],
    sources: &[&[T]],
    opening: &[T],
    max: usize,
) -> Vec<T> {
    if max == 0 {
        return Vec::new();
    }
    if out.is_empty() {
        return opening.iter().take(max).copied().collect();
    }
    for n in (MIN_NGRAM..=MAX_NGRAM.min(out.len())).rev() {
        let Some(gram) = out.get(out.len() - n..) else {
            continue;
        };
        for src in sources {
            if let Some(follows) = last_continuation(src, gram) {
                return follows.iter().take(max).copied().collect();
            }
        }
    }
    Vec::new()
}

/// What follows the last occurrence of `gram` in `src` that has anything
/// after it.
fn last_continuation<'a, T: PartialEq>(src: &'a [T], gram: &[T]) -> Option<&'a [T]> {
    let n = gram.len();
    if n == 0 || src.len() <= n {
        return None;
    }
    // A window one longer than the gram has at least one token after it.
    src.windows(n + 1)
        .rposition(|w| w.starts_with(gram))
        .and_then(|i| src.get(i + n..))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_match_is_continued() {
        let unit = [1, 2, 3, 4, 5, 6, 2, 9];
        // "1 2" occurs before 3, "6 2" before 9.
        assert_eq!(draft(&[7, 1, 2], &[&unit], &[], 3), [3, 4, 5]);
        assert_eq!(draft(&[6, 2], &[&unit], &[], 3), [9]);
        // One token alone matches too much to be looked up.
        assert!(draft(&[7, 2], &[&unit], &[], 3).is_empty());
    }

    #[test]
    fn an_earlier_source_wins_a_tie_and_a_longer_match_wins_over_order() {
        let unit = [5, 6, 7];
        let answer = [4, 5, 6, 8, 9];
        assert_eq!(draft(&[5, 6], &[&unit, &answer], &[], 4), [7]);
        assert_eq!(draft(&[4, 5, 6], &[&unit, &answer], &[], 4), [8, 9]);
    }

    #[test]
    fn nothing_to_draft() {
        assert!(draft(&[1, 2], &[&[3, 4, 5][..]], &[], 4).is_empty());
        // A match at the very end has no continuation.
        assert!(draft(&[3, 4], &[&[3, 4][..]], &[], 4).is_empty());
        assert!(draft(&[3, 4], &[&[3, 4, 5][..]], &[], 0).is_empty());
    }

    #[test]
    fn an_empty_output_drafts_the_last_answers_opening() {
        assert_eq!(draft::<u8>(&[], &[&[1, 2][..]], &[9, 8, 7], 2), [9, 8]);
    }
}
