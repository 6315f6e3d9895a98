//! Progress bars on standard error, one per stage.

use std::sync::Mutex;

use fanfold_core::Status;
use fanfold_engine::Progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct Bars {
    bar: Mutex<Option<ProgressBar>>,
}

impl Bars {
    pub fn new() -> Bars {
        Bars {
            bar: Mutex::new(None),
        }
    }
}

impl Progress for Bars {
    fn stage_started(&self, stage: &str, units: u64, cached: u64) {
        let bar = ProgressBar::with_draw_target(Some(units), ProgressDrawTarget::stderr());
        let style =
            ProgressStyle::with_template("{prefix:>14} [{bar:40}] {pos}/{len} {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(stage.to_owned());
        bar.set_position(cached);
        bar.set_message(format!("{cached} cached"));
        *self.bar.lock().unwrap_or_else(|e| e.into_inner()) = Some(bar);
    }

    fn unit_finished(&self, _stage: &str, status: Status) {
        if let Some(bar) = self.bar.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            bar.inc(1);
            if status == Status::Error {
                bar.set_message("errors so far: see facts.jsonl");
            }
        }
    }

    fn stage_finished(&self, _stage: &str) {
        if let Some(bar) = self.bar.lock().unwrap_or_else(|e| e.into_inner()).take() {
            bar.finish();
        }
    }
}
