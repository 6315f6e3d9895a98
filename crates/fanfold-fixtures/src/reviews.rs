//! Film reviews with a known sentiment and score each: the fixture for
//! questions a reducer answers from per-review facts (a film's share of
//! positive reviews, each film's mean score, pairs of reviews of one film
//! that agree or disagree).
//!
//! Every review says its sentiment in words, and most state a score out
//! of 5; the rest only word it ("a flawless film" is a 5). A 3 leans one
//! way or the other, and says which. The oracle holds each review's truth;
//! answers are derived from it, never stored.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::rng::Rng;

/// Each film, with the score its reviews lean to.
const FILMS: [(&str, &str, u64); 6] = [
    ("lantern-keeper", "The Lantern Keeper", 4),
    ("salt-and-iron", "Salt and Iron", 2),
    ("quiet-harbor", "Quiet Harbor", 3),
    ("neon-orchard", "Neon Orchard", 5),
    ("last-ferry", "The Last Ferry", 3),
    ("glass-mountains", "Glass Mountains", 1),
];

const AUTHORS: [&str; 12] = [
    "mara.k",
    "devon_r",
    "ilse",
    "tobias88",
    "noor",
    "quentin.l",
    "reza",
    "hallie",
    "oskar",
    "bea_t",
    "jun",
    "wren",
];

const OPENINGS: [&str; 6] = [
    "I watched {film} on a rainy Sunday with two friends.",
    "Saw {film} at the late show last week.",
    "Finally caught up with {film} after hearing about it for months.",
    "{film} was the second half of a double bill for me.",
    "My book club picked {film} for this month's screening.",
    "I went into {film} knowing nothing about it.",
];

/// What a review of each score but 3 says.
fn worded(score: u64) -> [&'static str; 3] {
    match score {
        1 => [
            "It is a complete waste of two hours and I walked out angry.",
            "Dreadful from start to finish; the worst film I have seen this year.",
            "An unwatchable mess that I would not recommend to anyone.",
        ],
        2 => [
            "Mostly dull, with a plot that falls apart in the last act.",
            "A disappointing film that never finds its footing.",
            "Weak writing and flat acting sink it.",
        ],
        4 => [
            "A really good film with a strong lead performance.",
            "I enjoyed it a lot and would happily see it again.",
            "Well made and moving, with only small flaws.",
        ],
        _ => [
            "A flawless film, the best I have seen in years.",
            "An absolute masterpiece; I loved every minute of it.",
            "Brilliant and unforgettable, a must-see.",
        ],
    }
}

/// A 3 that leans positive, then one that leans negative.
const LEANING: [[&str; 2]; 2] = [
    [
        "Uneven, but on balance I liked it more than not.",
        "Middling in places, yet it won me over by the end.",
    ],
    [
        "Some nice moments, but overall it left me cold.",
        "Competent enough, though on the whole I did not enjoy it.",
    ],
];

const CLOSINGS: [&str; 4] = [
    "The score is forgettable.",
    "The cinematography deserves a mention.",
    "It runs a little long.",
    "",
];

/// One review's truth.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ReviewTruth {
    pub film: String,
    /// `positive` or `negative`.
    pub sentiment: String,
    /// 1 to 5.
    pub score: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ReviewsOracle {
    pub seed: u64,
    pub per_film: usize,
    /// Film id to title.
    pub films: BTreeMap<String, String>,
    /// Review id to its truth.
    pub reviews: BTreeMap<String, ReviewTruth>,
}

pub struct GeneratedReviews {
    /// In id order, as `reviews.jsonl` holds them.
    pub reviews: Vec<Value>,
    pub oracle: ReviewsOracle,
}

/// How a review's text writes its punctuation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Punctuation {
    /// As typed: `, . ' !`.
    #[default]
    Plain,
    /// As some public review tables store it: every comma, full stop,
    /// apostrophe, semicolon and exclamation mark an HTML numeric entity
    /// (`&#44;` `&#46;` `&#8217;` `&#59;` `&#33;`), a dash and accented
    /// letters left as UTF-8, and one review in three broken over two
    /// lines. No sentence of such a text ends in a bare `.`.
    Entities,
}

/// `text` as a table with [`Punctuation::Entities`] stores it.
fn entity_encoded(text: &str, two_lines: bool) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    let mut broke = !two_lines;
    for c in text.chars() {
        match c {
            ',' => out.push_str("&#44;"),
            '.' => {
                out.push_str("&#46;");
                if !broke {
                    out.push('\n');
                    broke = true;
                    continue;
                }
            }
            '\'' => out.push_str("&#8217;"),
            ';' => out.push_str("&#59;"),
            '!' => out.push_str("&#33;"),
            other => out.push(other),
        }
    }
    // The line break replaces the blank after the first full stop.
    out.replace("\n ", "\n")
}

/// Critics' asides in the entity-encoded style: a dash and accented
/// letters, which the quotes must carry byte for byte.
const ASIDES: [&str; 3] = [
    "A film festival favourite \u{2014} déjà vu for some.",
    "Seen at the Cinémathèque; the café scene stays with you.",
    "",
];

/// `per_film` reviews of each of six films, ids `r001` upwards.
pub fn generate(seed: u64, per_film: usize) -> GeneratedReviews {
    generate_with(seed, per_film, Punctuation::Plain)
}

/// [`generate`] with its text written in `punctuation`. The words, the
/// ids and the oracle are the same in every style, but for the asides
/// the entity style adds (which say nothing of the verdict).
pub fn generate_with(seed: u64, per_film: usize, punctuation: Punctuation) -> GeneratedReviews {
    let mut reviews = Vec::new();
    let mut truth = BTreeMap::new();
    let mut n = 0u64;
    for (f, (film_id, title, lean)) in FILMS.iter().enumerate() {
        for i in 0..per_film {
            n += 1;
            let mut rng = Rng::derived(seed, f as u64, i as u64);
            // Around the film's lean: the same score half the time, one
            // step either way otherwise.
            let score = match rng.below(4) {
                0 => lean.saturating_sub(1).max(1),
                1 => (lean + 1).min(5),
                _ => *lean,
            };
            let (words, sentiment) = if score == 3 {
                let side = rng.index(2);
                let lines = LEANING.get(side).copied().unwrap_or_default();
                let sentiment = if side == 0 { "positive" } else { "negative" };
                (rng.pick(&lines), sentiment)
            } else {
                let lines = worded(score);
                let sentiment = if score >= 4 { "positive" } else { "negative" };
                (rng.pick(&lines), sentiment)
            };
            let mut text = rng.pick(&OPENINGS).replace("{film}", title);
            text.push(' ');
            text.push_str(words);
            // Most reviews state the score; some only word it.
            if rng.chance(75) {
                text.push_str(&format!(" I give it {score} out of 5."));
            }
            let closing = rng.pick(&CLOSINGS);
            if !closing.is_empty() {
                text.push(' ');
                text.push_str(closing);
            }
            if punctuation == Punctuation::Entities {
                let aside = rng.pick(&ASIDES);
                if !aside.is_empty() {
                    text.push(' ');
                    text.push_str(aside);
                }
                text = entity_encoded(&text, rng.chance(33));
            }
            let id = format!("r{n:03}");
            reviews.push(json!({
                "id": id,
                "film_id": film_id,
                "film": title,
                "author": rng.pick(&AUTHORS),
                "text": text,
            }));
            truth.insert(
                id,
                ReviewTruth {
                    film: (*film_id).to_owned(),
                    sentiment: sentiment.to_owned(),
                    score,
                },
            );
        }
    }
    GeneratedReviews {
        reviews,
        oracle: ReviewsOracle {
            seed,
            per_film,
            films: FILMS
                .iter()
                .map(|(id, title, _)| ((*id).to_owned(), (*title).to_owned()))
                .collect(),
            reviews: truth,
        },
    }
}

/// Writes `reviews.jsonl` and `oracle.json` into `dir`, as
/// `fanfold fixture film-reviews` does.
pub fn write_film_reviews(
    dir: &Path,
    seed: u64,
    per_film: usize,
    punctuation: Punctuation,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let generated = generate_with(seed, per_film, punctuation);
    let mut lines = String::new();
    for r in &generated.reviews {
        lines.push_str(&r.to_string());
        lines.push('\n');
    }
    std::fs::write(dir.join("reviews.jsonl"), lines)?;
    crate::issues::write_pretty(&dir.join("oracle.json"), &generated.oracle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_review_words_its_truth_and_films_differ() {
        let g = generate(5, 20);
        assert_eq!(g.reviews.len(), 120);
        let mut means: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for r in &g.reviews {
            let id = r["id"].as_str().expect("id");
            let t = &g.oracle.reviews[id];
            assert_eq!(r["film_id"], t.film.as_str());
            let text = r["text"].as_str().expect("text");
            if text.contains("out of 5") {
                assert!(text.contains(&format!("{} out of 5", t.score)), "{text}");
            }
            assert_eq!(
                t.sentiment == "positive",
                t.score >= 4
                    || (t.score == 3
                        && (text.contains("liked it") || text.contains("won me over"))),
                "{text}"
            );
            let m = means.entry(&t.film).or_default();
            m.0 += t.score;
            m.1 += 1;
        }
        // The films' leans survive the noise: the best and worst differ.
        let best = means["neon-orchard"];
        let worst = means["glass-mountains"];
        assert!(best.0 * worst.1 > worst.0 * best.1 + 2 * best.1 * worst.1);
    }

    #[test]
    fn entity_style_keeps_the_truth_and_hides_every_full_stop() {
        let plain = generate(5, 20);
        let encoded = generate_with(5, 20, Punctuation::Entities);
        assert_eq!(plain.oracle, encoded.oracle);
        let mut two_lines = 0;
        let mut non_ascii = 0;
        for (p, e) in plain.reviews.iter().zip(&encoded.reviews) {
            assert_eq!(p["id"], e["id"]);
            let text = e["text"].as_str().expect("text");
            assert!(!text.contains(['.', ',', '\'']), "{text}");
            assert!(text.contains("&#46;"), "{text}");
            let first = p["text"].as_str().expect("text").replace('\'', "&#8217;");
            let first = first.split(". ").next().expect("a sentence");
            assert!(text.starts_with(first), "{text}");
            two_lines += usize::from(text.contains('\n'));
            non_ascii += usize::from(!text.is_ascii());
        }
        assert!(two_lines > 20 && two_lines < 60, "{two_lines}");
        assert!(non_ascii > 20, "{non_ascii}");
    }

    #[test]
    fn the_same_seed_gives_the_same_reviews() {
        assert_eq!(generate(5, 20).reviews, generate(5, 20).reviews);
        assert_ne!(generate(5, 20).reviews, generate(6, 20).reviews);
    }
}
