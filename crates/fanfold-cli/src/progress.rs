//! What a run says of itself on standard error while it works. At a
//! terminal, a bar per stage. Anywhere else (a log file, a pipe, a CI job)
//! a line every 10 s, and every 5 % of a stage of 100 units or more: units
//! decided, model calls, rate and time left. At either, once a stage's
//! first units are decided, a stage expected to take more than a minute
//! says how many units and model calls are left and how long they take at
//! the rate those first units measured.

use std::collections::HashSet;
use std::io::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fanfold_core::Status;
use fanfold_engine::Progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A line at least this often while a stage runs, off a terminal.
const LINE_EVERY: Duration = Duration::from_secs(10);
/// A line at each of this many steps of a stage's units, off a terminal…
const STEPS: u64 = 20;
/// …when the stage has at least this many units to decide (fewer would
/// make a line of nearly every unit).
const STEPPED_UNITS: u64 = 100;
/// The expected time is judged once this many units are decided…
const MEASURED_UNITS: u64 = 8;
/// …or once this long has passed with at least one, whichever is first.
const MEASURED_WITHIN: Duration = Duration::from_secs(30);
/// The rate is measured over the units last decided, at most this many:
/// the first ones wait for the shared prefix and arrive together as the
/// slots fill, so a rate since the start says too little of what is left.
const RATE_WINDOW: usize = 64;
/// A stage expected to run longer than this says so.
const LONG_RUN: Duration = Duration::from_secs(60);

pub struct Bars {
    terminal: bool,
    /// Stages whose units are decided by model calls.
    model_stages: HashSet<String>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    bar: Option<ProgressBar>,
    stage: Option<Clock>,
    /// The run's model calls so far, retries included.
    calls: u64,
}

/// One stage's progress, timed.
struct Clock {
    name: String,
    /// Units the stage holds, cached ones included.
    units: u64,
    cached: u64,
    /// Units decided in this run, not from the cache.
    decided: u64,
    started: Instant,
    /// When each of the last [`RATE_WINDOW`] units was decided.
    recent: std::collections::VecDeque<Instant>,
    last_line: Instant,
    /// The last 5 % step a line was written for.
    step: u64,
    /// Whether the expected time was judged yet.
    measured: bool,
    /// Whether any line was written for the stage.
    spoke: bool,
}

impl Clock {
    fn left(&self) -> u64 {
        self.units.saturating_sub(self.cached + self.decided)
    }

    /// Units decided a second: over the last units decided when there
    /// are a few, else since the stage started. With the units it is
    /// measured over.
    fn measured(&self, now: Instant) -> Option<(f64, usize)> {
        if let (Some(first), Some(last)) = (self.recent.front(), self.recent.back())
            && self.recent.len() >= 5
        {
            let secs = last.duration_since(*first).as_secs_f64();
            if secs > 0.0 {
                return Some(((self.recent.len() - 1) as f64 / secs, self.recent.len()));
            }
        }
        self.overall_rate(now).map(|r| (r, self.decided as usize))
    }

    fn rate(&self, now: Instant) -> Option<f64> {
        self.measured(now).map(|(r, _)| r)
    }

    /// Units decided a second over the whole stage: what a finished stage
    /// reports, since a stage that decides its units in one burst at the
    /// end (an embed stage storing its vectors) has a last-units rate of
    /// thousands a second.
    fn overall_rate(&self, now: Instant) -> Option<f64> {
        let secs = now.duration_since(self.started).as_secs_f64();
        (self.decided > 0 && secs > 0.0).then(|| self.decided as f64 / secs)
    }

    /// `judge: done, 58 units decided in 3 min (0.32 units/s); 61 model calls`.
    fn finished_line(&self, calls: u64, now: Instant) -> String {
        let rate = self
            .overall_rate(now)
            .map_or(String::new(), |r| format!(" ({})", per_second(r)));
        format!(
            "{}: done, {} units decided in {}{rate}; {calls} model calls",
            self.name,
            self.decided,
            duration(now.duration_since(self.started))
        )
    }

    fn time_left(&self, now: Instant) -> Option<Duration> {
        let rate = self.rate(now)?;
        Some(Duration::from_secs_f64(self.left() as f64 / rate))
    }
}

impl Bars {
    /// Progress for `plan`'s run, as bars when standard error is a
    /// terminal and as lines when it is not.
    pub fn new(plan: &fanfold_engine::Plan) -> Bars {
        Bars::with_terminal(plan, std::io::IsTerminal::is_terminal(&std::io::stderr()))
    }

    fn with_terminal(plan: &fanfold_engine::Plan, terminal: bool) -> Bars {
        let model_stages = plan
            .stages
            .iter()
            .filter(|s| matches!(s.shape().calls, fanfold_engine::kit::Calls::Model { .. }))
            .map(|s| s.name().to_owned())
            .collect();
        Bars {
            terminal,
            model_stages,
            state: Mutex::new(State::default()),
        }
    }

    /// Runs `work`, writing a line every [`LINE_EVERY`] off a terminal even
    /// while no unit finishes (a slow model call, a long fold).
    pub fn while_running<T>(&self, work: impl FnOnce() -> T) -> T {
        let (done, wait) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|scope| {
            scope.spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    wait.recv_timeout(Duration::from_secs(1))
                {
                    self.tick();
                }
            });
            let out = work();
            drop(done);
            out
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A line if the last one is [`LINE_EVERY`] old.
    fn tick(&self) {
        if self.terminal {
            return;
        }
        let mut state = self.state();
        let calls = state.calls;
        if let Some(clock) = state.stage.as_mut()
            && clock.last_line.elapsed() >= LINE_EVERY
        {
            self.line(clock, calls, Instant::now());
        }
    }

    /// `judge: 50 of 250 units decided (20 %), 3 cached; 52 model calls;
    /// 0.26 units/s; about 12 min left`.
    fn line(&self, clock: &mut Clock, calls: u64, now: Instant) {
        let done = clock.cached + clock.decided;
        let pct = 100 * done / clock.units.max(1);
        let cached = if clock.cached > 0 {
            format!(", {} cached", clock.cached)
        } else {
            String::new()
        };
        let pace = match (clock.rate(now), clock.time_left(now)) {
            (Some(rate), Some(left)) => {
                format!("; {}; about {} left", per_second(rate), duration(left))
            }
            _ => "; no unit decided yet".to_owned(),
        };
        say(&format!(
            "{}: {done} of {} units decided ({pct} %){cached}; {calls} model calls{pace}",
            clock.name, clock.units
        ));
        clock.last_line = now;
        clock.spoke = true;
    }

    /// Once the first units are decided: when the rest would take more
    /// than a minute at their rate, says how many, with how many calls, and
    /// how long.
    fn judge_time(&self, clock: &mut Clock, calls: u64, now: Instant) -> Option<String> {
        if clock.measured
            || clock.decided == 0
            || (clock.decided < MEASURED_UNITS
                && now.duration_since(clock.started) < MEASURED_WITHIN)
        {
            return None;
        }
        clock.measured = true;
        let (rate, over) = clock.measured(now)?;
        let left = clock.time_left(now)?;
        if left <= LONG_RUN {
            return None;
        }
        let calls = if self.model_stages.contains(&clock.name) {
            format!(
                " ({} model calls, more with retries; {calls} made so far)",
                clock.left()
            )
        } else {
            String::new()
        };
        Some(format!(
            "{}: {} units left to decide{calls}: about {} at {}, measured over its last {over} units. Ctrl-C stops the run; a rerun pays only for the units not yet decided.",
            clock.name,
            clock.left(),
            duration(left),
            per_second(rate),
        ))
    }
}

/// A line on standard error; a closed one is no reason to stop a run.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn per_second(rate: f64) -> String {
    if rate >= 10.0 {
        format!("{rate:.0} units/s")
    } else if rate >= 0.1 {
        format!("{rate:.2} units/s")
    } else {
        format!("{:.1} units/min", rate * 60.0)
    }
}

/// `45 s`, `16 min`, `2 h 5 min`.
fn duration(d: Duration) -> String {
    let s = d.as_secs();
    if s < 90 {
        format!("{s} s")
    } else if s < 90 * 60 {
        format!("{} min", (s + 30) / 60)
    } else {
        format!("{} h {} min", s / 3600, (s % 3600 + 30) / 60)
    }
}

impl Progress for Bars {
    fn stage_started(&self, stage: &str, units: u64, cached: u64) {
        let mut state = self.state();
        let now = Instant::now();
        state.stage = Some(Clock {
            name: stage.to_owned(),
            units,
            cached,
            decided: 0,
            started: now,
            recent: std::collections::VecDeque::new(),
            last_line: now,
            step: (cached * STEPS).checked_div(units).unwrap_or(0),
            measured: false,
            spoke: false,
        });
        if !self.terminal {
            return;
        }
        let bar = ProgressBar::with_draw_target(Some(units), ProgressDrawTarget::stderr());
        let style =
            ProgressStyle::with_template("{prefix:>14} [{bar:40}] {pos}/{len} {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(stage.to_owned());
        bar.set_position(cached);
        bar.set_message(format!("{cached} cached"));
        state.bar = Some(bar);
    }

    fn model_calls(&self, calls: u64) {
        self.state().calls = calls;
    }

    fn unit_finished(&self, _stage: &str, status: Status) {
        let mut state = self.state();
        let calls = state.calls;
        let now = Instant::now();
        let State { bar, stage, .. } = &mut *state;
        let Some(clock) = stage.as_mut() else { return };
        clock.decided += 1;
        if clock.recent.len() == RATE_WINDOW {
            clock.recent.pop_front();
        }
        clock.recent.push_back(now);
        let notice = self.judge_time(clock, calls, now);
        if let Some(bar) = bar.as_ref() {
            bar.inc(1);
            if status == Status::Error {
                bar.set_message("errors so far: see facts.jsonl");
            }
            if let Some(n) = notice {
                bar.println(n);
            }
            return;
        }
        if let Some(n) = notice {
            say(&n);
        }
        let to_decide = clock.units.saturating_sub(clock.cached);
        let step = (clock.cached + clock.decided) * STEPS / clock.units.max(1);
        let stepped = to_decide >= STEPPED_UNITS && step > clock.step;
        clock.step = clock.step.max(step);
        if stepped || clock.last_line.elapsed() >= LINE_EVERY {
            self.line(clock, calls, now);
        }
    }

    fn stage_finished(&self, _stage: &str) {
        let mut state = self.state();
        if let Some(bar) = state.bar.take() {
            bar.finish();
        }
        let calls = state.calls;
        if let Some(clock) = state.stage.take()
            && clock.spoke
        {
            say(&clock.finished_line(calls, Instant::now()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(duration(Duration::from_secs(45)), "45 s");
        assert_eq!(duration(Duration::from_secs(16 * 60 + 10)), "16 min");
        assert_eq!(
            duration(Duration::from_secs(2 * 3600 + 5 * 60)),
            "2 h 5 min"
        );
        assert_eq!(per_second(0.26), "0.26 units/s");
        assert_eq!(per_second(0.05), "3.0 units/min");
    }

    #[test]
    fn a_finished_stage_reports_its_whole_rate_not_its_last_burst() {
        let started = Instant::now();
        let end = started + Duration::from_secs(10);
        // Two units early, then the last 64 (the whole window) decided
        // within a millisecond at the end.
        let recent = (0..RATE_WINDOW as u64)
            .map(|i| end - Duration::from_micros(1_000 - i))
            .collect();
        let clock = Clock {
            name: "auth_similarity".into(),
            units: 66,
            cached: 0,
            decided: 66,
            started,
            recent,
            last_line: started,
            step: 0,
            measured: false,
            spoke: true,
        };
        assert_eq!(
            clock.finished_line(0, end),
            "auth_similarity: done, 66 units decided in 10 s (6.60 units/s); 0 model calls"
        );
    }
}
