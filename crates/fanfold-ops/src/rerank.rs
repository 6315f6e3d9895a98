//! The rerank operator's pure half: the question the model is asked of a
//! unit, the answer's schema, a unit's score from the answer, and the cut
//! that decides which units go on.

use fanfold_core::ChoiceScore;
use serde_json::{Value, json};

/// Where the reranker's answer holds its verdict.
pub const RELEVANT_POINTER: &str = "/relevant";
/// The verdict that scores a unit up.
pub const YES: &str = "yes";
pub const NO: &str = "no";

/// The rubric a reranker's shared prefix carries: the question, and what
/// to answer.
pub fn rubric(question: &str) -> String {
    format!(
        "You rank records by how useful they are for answering a question.\n\nQuestion: {}\n\nRead the record. Answer `yes` if it is relevant to the question (it could be part of the answer), `no` if it is not.\n",
        question.trim()
    )
}

/// The answer's JSON Schema: the verdict alone.
pub fn output_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"relevant": {"type": "string", "enum": [YES, NO]}},
        "required": ["relevant"],
        "additionalProperties": false
    })
}

/// A unit's score in [0, 1]: the probability of `yes` where the backend
/// read the verdict's probabilities from the model, else the verdict's
/// confidence for `yes` (and its complement for `no`), else 1 for `yes`
/// and 0 for `no`. `None` for a unit with no verdict.
pub fn score(
    decision: Option<&str>,
    choices: &[ChoiceScore],
    confidence: Option<f64>,
) -> Option<f64> {
    if let Some(c) = choices.iter().find(|c| c.choice == YES) {
        return Some(c.p.clamp(0.0, 1.0));
    }
    let sure = confidence.unwrap_or(1.0).clamp(0.0, 1.0);
    match decision {
        Some(YES) => Some(sure),
        Some(NO) => Some(1.0 - sure),
        _ => None,
    }
}

/// Where one scored unit ended: its rank (0 the best) and whether it is
/// kept.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Placed {
    pub unit: usize,
    pub score: f64,
    pub rank: usize,
    pub kept: bool,
}

/// Ranks `scored` (a unit and its score) best first, ties to the lower
/// unit (earlier in source order), and keeps those within `top_k` and at
/// or above `min_score`. Returned in rank order.
pub fn cut(scored: &[(usize, f64)], top_k: Option<usize>, min_score: Option<f64>) -> Vec<Placed> {
    let mut order: Vec<(usize, f64)> = scored.to_vec();
    order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    order
        .into_iter()
        .enumerate()
        .map(|(rank, (unit, score))| Placed {
            unit,
            score,
            rank,
            kept: top_k.is_none_or(|k| rank < k) && min_score.is_none_or(|m| score >= m),
        })
        .collect()
}

/// Why a spec's cut cannot work, if it cannot.
pub fn check_cut(top_k: Option<usize>, min_score: Option<f64>) -> Result<(), String> {
    match (top_k, min_score) {
        (None, None) => {
            Err("needs `top_k`, `min_score` or both: without a cut every unit goes on".into())
        }
        (Some(0), _) => Err("`top_k` must be at least 1".into()),
        (_, Some(m)) if !(0.0..=1.0).contains(&m) => {
            Err(format!("`min_score` {m} is not within [0, 1]"))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(c: &str, p: f64) -> ChoiceScore {
        ChoiceScore {
            choice: c.into(),
            p,
        }
    }

    #[test]
    fn the_score_is_the_probability_of_yes_where_the_model_gave_one() {
        let scores = [choice("no", 0.7), choice("yes", 0.3)];
        assert_eq!(score(Some("no"), &scores, Some(0.7)), Some(0.3));
        assert_eq!(score(Some("yes"), &[], Some(0.8)), Some(0.8));
        assert_eq!(score(Some("no"), &[], Some(0.8)), Some(1.0 - 0.8));
        assert_eq!(score(Some("yes"), &[], None), Some(1.0));
        assert_eq!(score(Some("no"), &[], None), Some(0.0));
        assert_eq!(score(None, &[], None), None);
    }

    #[test]
    fn the_cut_keeps_the_best_k_at_or_above_the_floor_ties_to_the_earlier_unit() {
        let scored = [(4, 0.9), (1, 0.2), (2, 0.9), (3, 0.5), (0, 0.6)];
        let placed = cut(&scored, Some(3), None);
        let kept: Vec<usize> = placed.iter().filter(|p| p.kept).map(|p| p.unit).collect();
        assert_eq!(kept, vec![2, 4, 0]);
        assert_eq!(
            placed.iter().map(|p| p.rank).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4]
        );
        let floor = cut(&scored, None, Some(0.55));
        let kept: Vec<usize> = floor.iter().filter(|p| p.kept).map(|p| p.unit).collect();
        assert_eq!(kept, vec![2, 4, 0]);
        let both = cut(&scored, Some(2), Some(0.95));
        assert!(both.iter().all(|p| !p.kept));
    }

    #[test]
    fn a_cut_that_keeps_everything_or_nothing_is_refused() {
        assert!(check_cut(None, None).is_err());
        assert!(check_cut(Some(0), None).is_err());
        assert!(check_cut(None, Some(1.5)).is_err());
        assert!(check_cut(Some(5), Some(0.5)).is_ok());
    }
}
