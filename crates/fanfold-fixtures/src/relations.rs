//! A seeded issue export where one record is not enough: which open bugs
//! are regressions of a fix an earlier, closed issue reported?
//!
//! A regression here reads like any new bug report; only a closed issue
//! elsewhere in the tracker, worded differently, says the same bug was
//! fixed. The traps are pairs that look the same without a fix (two open
//! reports of one bug; a closed report that was never fixed), lone bug
//! reports, and feature requests. The [`RelationsOracle`] lists the
//! regressions, the issue each one regresses, and every trap.
//!
//! Regeneration: `fanfold fixture issue-relations --out
//! examples/issue-relations` calls [`write_issue_relations`]`(dir, 11, 120)`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::rng::Rng;
use crate::time::{epoch, rfc3339};

pub const QUESTION: &str =
    "Which open issues report a bug that an earlier, closed issue says was fixed (a regression)?";

/// One bug, as its first and its later reporter put it: a title and a
/// sentence each, in different words.
struct Symptom {
    first: (&'static str, &'static str),
    later: (&'static str, &'static str),
}

const SYMPTOMS: &[Symptom] = &[
    Symptom {
        first: (
            "CSV export drops the last row",
            "Exporting a report to CSV leaves out the final row of the table.",
        ),
        later: (
            "Exported CSV is missing its final line",
            "When I download the report as CSV the bottom row never shows up in the file.",
        ),
    },
    Symptom {
        first: (
            "App crashes when uploading a photo larger than 10 MB",
            "Selecting a big photo for upload closes the app immediately.",
        ),
        later: (
            "Large image upload makes the app quit",
            "Picking a high resolution picture to upload kills the app without an error.",
        ),
    },
    Symptom {
        first: (
            "Search returns no results for words with accents",
            "Searching for café or naïve finds nothing although matching documents exist.",
        ),
        later: (
            "Accented search terms match nothing",
            "Queries containing é or ü come back empty even though the notes contain them.",
        ),
    },
    Symptom {
        first: (
            "Email notifications are sent twice",
            "Every comment triggers two identical notification emails.",
        ),
        later: (
            "Duplicate notification mails for each comment",
            "I get the same email about a new comment two times in a row.",
        ),
    },
    Symptom {
        first: (
            "Dashboard chart shows wrong totals after midnight UTC",
            "The daily totals on the dashboard chart are off for users east of UTC.",
        ),
        later: (
            "Daily totals on the chart are shifted by a day",
            "Numbers on the dashboard graph land on the wrong day for my time zone.",
        ),
    },
    Symptom {
        first: (
            "Calendar sync creates duplicate events",
            "Syncing with the external calendar copies each event again on every sync.",
        ),
        later: (
            "Events multiply after every calendar sync",
            "Each time the calendar syncs I end up with another copy of the same meetings.",
        ),
    },
    Symptom {
        first: (
            "Webhook retries never stop after a 410 response",
            "A webhook endpoint that answers 410 Gone keeps being retried forever.",
        ),
        later: (
            "Gone webhook endpoints are retried endlessly",
            "Our removed endpoint returns 410 but deliveries to it continue without end.",
        ),
    },
    Symptom {
        first: (
            "Dark mode text is unreadable in the settings page",
            "In dark mode the settings labels are dark grey on black.",
        ),
        later: (
            "Settings labels invisible with the dark theme",
            "With the dark theme on, I cannot read the option names on the settings screen.",
        ),
    },
    Symptom {
        first: (
            "Invoice PDF shows the wrong currency symbol",
            "Invoices for customers in euros are printed with a dollar sign.",
        ),
        later: (
            "Euro invoices render a dollar sign",
            "The generated PDF bill uses $ for accounts that pay in EUR.",
        ),
    },
    Symptom {
        first: (
            "API client times out on responses over 1 MB",
            "Large API responses make the client hang until the 30 second timeout.",
        ),
        later: (
            "Client hangs on big API payloads",
            "Fetching a large result set through the SDK stalls and then times out.",
        ),
    },
    Symptom {
        first: (
            "Password reset link expires immediately",
            "The reset link in the email says it has expired the moment it is opened.",
        ),
        later: (
            "Reset password email link is already invalid",
            "Clicking the link to reset my password always tells me the token is expired.",
        ),
    },
    Symptom {
        first: (
            "Drag and drop reorders the wrong item in lists",
            "Dragging an item in a long list moves the one below it instead.",
        ),
        later: (
            "Dragging list entries moves a neighbour",
            "When I drag a task to reorder it, the task next to it is the one that moves.",
        ),
    },
    Symptom {
        first: (
            "Mobile keyboard covers the comment box",
            "On phones the on-screen keyboard hides the field you are typing in.",
        ),
        later: (
            "Cannot see what I type in comments on Android",
            "The soft keyboard overlaps the comment input so the text is hidden.",
        ),
    },
    Symptom {
        first: (
            "Time zone setting resets after logout",
            "The chosen time zone goes back to the default each time a user signs out.",
        ),
        later: (
            "Preferred time zone forgotten between sessions",
            "After signing in again my time zone preference is back to UTC.",
        ),
    },
    Symptom {
        first: (
            "Bulk delete removes items that were not selected",
            "Deleting a selection of rows also deletes rows on the next page.",
        ),
        later: (
            "Deleting selected rows also deletes others",
            "Mass deletion wiped entries that I had not ticked, from another page.",
        ),
    },
    Symptom {
        first: (
            "Markdown tables render without borders",
            "Tables written in Markdown show up as plain text with no grid.",
        ),
        later: (
            "Table syntax in notes is not rendered",
            "Pipe tables in a note display as raw text instead of a formatted table.",
        ),
    },
    Symptom {
        first: (
            "Memory grows without bound in the sync worker",
            "The background sync worker's memory use climbs until it is killed.",
        ),
        later: (
            "Sync service leaks memory until OOM",
            "Our sync process gets killed by the out of memory killer after a few hours.",
        ),
    },
    Symptom {
        first: (
            "Shared links open the login page for public documents",
            "A document shared publicly still asks visitors to sign in.",
        ),
        later: (
            "Public share links demand a login",
            "People I send a public link to are forced to a sign in screen.",
        ),
    },
    Symptom {
        first: (
            "Audio cuts out after five minutes in calls",
            "Voice calls lose audio at around the five minute mark.",
        ),
        later: (
            "Call sound drops a few minutes in",
            "During longer calls the audio goes silent after roughly five minutes.",
        ),
    },
    Symptom {
        first: (
            "Autosave overwrites newer edits from another tab",
            "Editing in two tabs makes the older tab's autosave replace the newer text.",
        ),
        later: (
            "Second browser tab clobbers my changes",
            "An old tab saved over the edits I had just made in a different tab.",
        ),
    },
    Symptom {
        first: (
            "Import fails on files with a byte order mark",
            "CSV files saved by Excel with a BOM are rejected by the importer.",
        ),
        later: (
            "Importer rejects UTF-8 BOM files",
            "Uploading a spreadsheet exported from Excel errors out at the first column.",
        ),
    },
    Symptom {
        first: (
            "Two-factor codes are rejected when the phone clock drifts",
            "A one minute clock difference makes every authenticator code invalid.",
        ),
        later: (
            "Authenticator codes fail with slight clock skew",
            "My 2FA codes are refused unless my phone time is exactly right.",
        ),
    },
    Symptom {
        first: (
            "Printing a board cuts off the last column",
            "The printed version of a board loses its rightmost column.",
        ),
        later: (
            "Rightmost column missing from printouts",
            "When I print the kanban view the final column does not appear on paper.",
        ),
    },
    Symptom {
        first: (
            "Tooltips stay on screen after the mouse leaves",
            "Hovering a button leaves its tooltip stuck until the page reloads.",
        ),
        later: (
            "Stuck hover hints on toolbar buttons",
            "Hint popups remain visible after moving the pointer away from the toolbar.",
        ),
    },
];

/// What the generator made each symptom into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// A closed issue says it was fixed; a later open issue reports it again.
    Regression,
    /// Two open reports of one bug, never fixed: not a regression.
    OpenPair,
    /// A closed report that was never fixed, reported again: not a regression.
    ClosedUnfixed,
    /// One open report alone.
    Lone,
}

const FEATURES: &[&str] = &[
    "Add keyboard shortcuts for the editor",
    "Support exporting boards to PDF",
    "Allow custom fields on tasks",
    "Offer a weekly summary email",
    "Let admins set a default language",
    "Add an API endpoint for archived items",
    "Provide a command line client",
    "Support SAML single sign-on for teams",
    "Show word counts in notes",
    "Allow pinning comments",
    "Add a high contrast theme",
    "Let users mute a thread",
];

const PEOPLE: &[&str] = &[
    "amara-o",
    "bjorn",
    "chen-li",
    "dpatel",
    "elif",
    "fgarcia",
    "gwen",
    "hiro-t",
    "ines",
    "jkowalski",
    "kwame",
    "lucia-m",
];

const FIX_NOTES: &[&str] = &[
    "Fixed in #{pr}; the fix shipped in 2.{minor}.1.",
    "Closing: fixed by #{pr}, released in 2.{minor}.0.",
    "This was fixed in #{pr} and is part of 2.{minor}.2.",
];

const UNFIXED_NOTES: &[&str] = &[
    "Closing as we could not reproduce it.",
    "Closing: won't fix for now, the old behaviour stays.",
    "Closing as stale; no reply from the reporter.",
];

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RelationsOracle {
    pub question: String,
    pub seed: u64,
    pub count: usize,
    /// Sorted numbers of the open issues that are regressions.
    pub regression_ids: Vec<u64>,
    /// Each regression's number to the closed issue that reported its fix.
    pub regresses: BTreeMap<u64, u64>,
    /// Trap category to sorted issue numbers: `open_pairs` (both issues),
    /// `closed_unfixed` (the later, open issue), `lone_bugs`, `features`.
    pub traps: BTreeMap<String, Vec<u64>>,
}

pub struct GeneratedRelations {
    /// In gh's order: descending issue number.
    pub issues: Vec<Value>,
    pub oracle: RelationsOracle,
}

/// Generates `count` issues numbered `1..=count` (at least the 48 the bug
/// reports take; the rest are feature requests).
pub fn generate(seed: u64, count: usize) -> GeneratedRelations {
    let mut rng = Rng::derived(seed, 0x5e1a, 0);
    let mut roles: Vec<Role> = [
        (Role::Regression, 9),
        (Role::OpenPair, 6),
        (Role::ClosedUnfixed, 4),
        (Role::Lone, 5),
    ]
    .iter()
    .flat_map(|&(r, n)| std::iter::repeat_n(r, n))
    .collect();
    roles.truncate(SYMPTOMS.len());
    rng.shuffle(&mut roles);
    // Each issue is placed at a random moment; numbers follow time.
    struct Draft {
        at: i64,
        title: String,
        body: String,
        closed: Option<String>,
        bug: bool,
        tag: (usize, bool),
    }
    let start = epoch(2026, 1, 5, 9, 0, 0);
    let span = 300 * 86_400;
    let mut drafts: Vec<Draft> = Vec::new();
    for (s, (symptom, role)) in SYMPTOMS.iter().zip(&roles).enumerate() {
        let first_at = start + rng.range(0, span / 2) as i64;
        let later_at = first_at + rng.range(14, 120) as i64 * 86_400;
        let note = match role {
            Role::Regression => Some(
                rng.pick(FIX_NOTES)
                    .replace("{pr}", &rng.range(200, 900).to_string())
                    .replace("{minor}", &rng.range(1, 6).to_string()),
            ),
            Role::ClosedUnfixed => Some(rng.pick(UNFIXED_NOTES).to_owned()),
            Role::OpenPair | Role::Lone => None,
        };
        drafts.push(Draft {
            at: first_at,
            title: symptom.first.0.into(),
            body: format!("{}\n\nSteps: open the app and try it.", symptom.first.1),
            closed: note,
            bug: true,
            tag: (s, false),
        });
        if *role != Role::Lone {
            drafts.push(Draft {
                at: later_at,
                title: symptom.later.0.into(),
                body: format!(
                    "{}\n\nSeen on version 2.{}.",
                    symptom.later.1,
                    rng.range(6, 9)
                ),
                closed: None,
                bug: true,
                tag: (s, true),
            });
        }
    }
    let features = count.saturating_sub(drafts.len());
    for (f, &title) in FEATURES.iter().cycle().take(features).enumerate() {
        let closed = rng
            .chance(30)
            .then(|| "Closing: shipped in the last release.".to_owned());
        drafts.push(Draft {
            at: start + rng.range(0, span) as i64,
            title: if f < FEATURES.len() {
                title.to_owned()
            } else {
                let platform = match f / FEATURES.len() % 3 {
                    0 => "web",
                    1 => "mobile",
                    _ => "desktop",
                };
                format!("{title} ({platform})")
            },
            body: "It would help our team a lot. Is this on the roadmap?".into(),
            closed,
            bug: false,
            tag: (usize::MAX, false),
        });
    }
    drafts.sort_by_key(|d| (d.at, d.title.clone()));
    let mut regression_ids = Vec::new();
    let mut regresses = BTreeMap::new();
    let mut traps: BTreeMap<String, Vec<u64>> =
        ["open_pairs", "closed_unfixed", "lone_bugs", "features"]
            .iter()
            .map(|k| ((*k).to_owned(), Vec::new()))
            .collect();
    let mut first_of: BTreeMap<usize, u64> = BTreeMap::new();
    let mut issues = Vec::with_capacity(drafts.len());
    for (i, d) in drafts.iter().enumerate() {
        let number = i as u64 + 1;
        let (s, later) = d.tag;
        let role = roles.get(s).copied();
        if !d.bug {
            traps.entry("features".into()).or_default().push(number);
        } else if !later {
            first_of.insert(s, number);
            match role {
                Some(Role::OpenPair) => traps.entry("open_pairs".into()).or_default().push(number),
                Some(Role::Lone) => traps.entry("lone_bugs".into()).or_default().push(number),
                _ => {}
            }
        } else {
            match role {
                Some(Role::Regression) => {
                    regression_ids.push(number);
                    if let Some(&first) = first_of.get(&s) {
                        regresses.insert(number, first);
                    }
                }
                Some(Role::OpenPair) => traps.entry("open_pairs".into()).or_default().push(number),
                Some(Role::ClosedUnfixed) => traps
                    .entry("closed_unfixed".into())
                    .or_default()
                    .push(number),
                _ => {}
            }
        }
        let closed_at = d.closed.as_ref().map(|_| rfc3339(d.at + 3 * 86_400));
        let body = match &d.closed {
            Some(note) => format!("{}\n\n{note}", d.body),
            None => d.body.clone(),
        };
        let mut person = Rng::derived(seed, 0x9e0, number);
        issues.push(json!({
            "number": number,
            "title": d.title,
            "body": body,
            "state": if d.closed.is_some() { "CLOSED" } else { "OPEN" },
            "labels": [{"name": if d.bug { "bug" } else { "enhancement" }}],
            "author": {"login": person.pick(PEOPLE)},
            "createdAt": rfc3339(d.at),
            "closedAt": closed_at,
        }));
    }
    issues.reverse();
    for v in traps.values_mut() {
        v.sort_unstable();
    }
    regression_ids.sort_unstable();
    GeneratedRelations {
        issues,
        oracle: RelationsOracle {
            question: QUESTION.into(),
            seed,
            count: drafts.len(),
            regression_ids,
            regresses,
            traps,
        },
    }
}

/// Writes `issues.json` and `oracle.json` into `dir`, as
/// `fanfold fixture issue-relations` does.
pub fn write_issue_relations(dir: &Path, seed: u64, count: usize) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let generated = generate(seed, count);
    crate::issues::write_pretty(&dir.join("issues.json"), &generated.issues)?;
    crate::issues::write_pretty(&dir.join("oracle.json"), &generated.oracle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_regression_follows_a_closed_fix_and_no_trap_does() {
        let g = generate(11, 120);
        assert_eq!(g.issues.len(), 120);
        let by_number: BTreeMap<u64, &Value> = g
            .issues
            .iter()
            .filter_map(|i| Some((i["number"].as_u64()?, i)))
            .collect();
        assert_eq!(g.oracle.regression_ids.len(), 9);
        for (later, first) in &g.oracle.regresses {
            let (l, f) = (by_number[later], by_number[first]);
            assert_eq!(l["state"], "OPEN");
            assert_eq!(f["state"], "CLOSED");
            assert!(f["body"].as_str().is_some_and(|b| b.contains("#")));
            assert!(first < later);
            assert_ne!(l["title"], f["title"], "worded differently");
        }
        for n in &g.oracle.traps["closed_unfixed"] {
            assert_eq!(by_number[n]["state"], "OPEN");
            assert!(!g.oracle.regression_ids.contains(n));
        }
        assert_eq!(g.oracle.traps["open_pairs"].len(), 12);
        assert_eq!(g.oracle.traps["lone_bugs"].len(), 5);
    }

    #[test]
    fn the_same_seed_gives_the_same_issues() {
        assert_eq!(generate(11, 120).issues, generate(11, 120).issues);
        assert_ne!(generate(11, 120).issues, generate(12, 120).issues);
    }
}
