//! The stage phase of a run: every unit stage in spec order over the
//! units the prefilter routed, following each stage's declared shape;
//! then the model reducers over the answer's facts. Nothing here names a
//! kind.

use std::collections::{BTreeMap, HashMap, HashSet};

use fanfold_core::spec::ContractSpec;
use fanfold_core::{FactRecord, Status};
use fanfold_ops::contract::{Controller, StopReason};
use fanfold_store::Store;

use super::{Phases, RunOptions, RunSettings, route};
use crate::Progress;
use crate::error::RunError;
use crate::kit::born::{Litter, Nursery};
use crate::kit::table::Lineage;
use crate::kit::{
    ActGate, Backends, FactLedger, NegativeReads, Negatives, RungUnits, Shared, Stage,
    StageContext, UnitScores, UnitTable,
};
use crate::plan::Plan;
use crate::queue::BudgetPool;
use crate::report::RunStats;

/// What every stage of one run shares and never changes.
pub(super) struct Scope<'a> {
    pub plan: &'a Plan,
    pub settings: &'a RunSettings,
    pub progress: &'a dyn Progress,
    pub store: &'a Store,
    pub run_id: &'a str,
    pub routed: &'a route::Routed,
    pub budget: &'a BudgetPool,
}

/// What the stages of one run add to as they go.
pub(super) struct State {
    pub backends: Backends,
    pub shared: Shared,
    pub stats: RunStats,
}

impl State {
    /// Fresh state, with every stage's report key declared, so the
    /// certificate shows it even when the stage reports nothing.
    pub fn new(plan: &Plan, opts: &RunOptions, settings: &RunSettings) -> State {
        let mut stats = RunStats {
            slots: settings.slots,
            ..RunStats::default()
        };
        for stage in &plan.stages {
            if let Some(key) = stage.report_key() {
                stats.reports.declare(key);
            }
        }
        State {
            backends: Backends::new(opts.record.clone()),
            shared: Shared::default(),
            stats,
        }
    }
}

/// How the unit stages ended.
pub(super) struct Staged {
    pub stop: StopReason,
    /// What each stage received: from the prefilter, or passed on by a
    /// stage in front of it.
    pub received: BTreeMap<String, u64>,
    /// Units whose answer is a later stage's fact (an audit sent them
    /// back, a map could not decide them alone), and the stage that
    /// answers.
    pub escalated: HashMap<usize, String>,
    /// What the units observations bore looked like, for the certificate.
    pub nursery: Nursery,
    /// Every unit id the table holds, once a unit was bred (a bred id the
    /// table holds already is dropped, never given twice).
    ids: Option<HashSet<fanfold_core::UnitId>>,
    /// What waits for each stage: from the prefilter, or passed on by a
    /// stage in front of it.
    queued: BTreeMap<String, Vec<usize>>,
}

/// The pointer to a top-k contract's score, which the ledger reads.
pub(super) fn score_pointer(contract: &ContractSpec) -> Option<String> {
    match contract {
        ContractSpec::TopK { score, .. } => Some(score.clone()),
        _ => None,
    }
}

impl Scope<'_> {
    fn context<'b>(
        &'b self,
        table: &'b UnitTable,
        state: &'b mut State,
        ledger: &'b FactLedger<'b>,
        negatives: &'b Negatives,
        facts: &'b [(usize, FactRecord)],
        act: &'b ActGate,
    ) -> StageContext<'b> {
        StageContext {
            spec: &self.plan.spec,
            spec_dir: &self.plan.spec_dir,
            store: self.store,
            run_id: self.run_id,
            table,
            slots: self.settings.slots,
            budget: self.budget,
            ledger,
            backends: &mut state.backends,
            shared: &mut state.shared,
            progress: self.progress,
            stats: &mut state.stats,
            negatives,
            facts,
            act,
        }
    }

    /// Runs every stage that reads units or negatives (a model reducer
    /// reads the answer's facts once they are all known, `reducers`; an
    /// effect acts on the verified answer, `effects`). The first pass
    /// runs them in spec order; an audit runs once, there. Units it sends
    /// back to an earlier stage run in a second pass, which only moves
    /// units forward, so it is the last.
    pub fn unit_stages<'l>(
        &self,
        table: &mut UnitTable,
        state: &mut State,
        ledger: &'l FactLedger<'l>,
        phases: &mut Phases,
    ) -> Result<Staged, RunError> {
        let mut staged = Staged {
            stop: StopReason::Completed,
            received: BTreeMap::new(),
            escalated: HashMap::new(),
            nursery: Nursery::default(),
            ids: None,
            queued: self.routed.by_stage.clone(),
        };
        for pass in 0..2 {
            for stage in &self.plan.stages {
                let shape = stage.shape();
                if shape.reads_facts().is_some() || shape.reads_answer() {
                    continue;
                }
                self.unit_stage(stage.as_ref(), pass, table, state, ledger, &mut staged)?;
                phases.mark(&format!("{}:{}", stage.kind(), stage.name()));
            }
            if staged.queued.values().all(Vec::is_empty) {
                break;
            }
        }
        Ok(staged)
    }

    /// Runs one stage over what is queued for it, and queues what it
    /// passes, sends and escalates.
    fn unit_stage<'l>(
        &self,
        stage: &dyn Stage,
        pass: usize,
        table: &mut UnitTable,
        state: &mut State,
        ledger: &'l FactLedger<'l>,
        staged: &mut Staged,
    ) -> Result<(), RunError> {
        let shape = stage.shape();
        let reads = shape.reads_negatives();
        let tripped = matches!(staged.stop, StopReason::BreakerTripped { .. });
        let units = match reads {
            // An audit of a run a breaker stopped would measure rungs that
            // never finished: it is not paid for.
            Some(_) if pass > 0 || tripped => return Ok(()),
            Some(_) => Vec::new(),
            None => match staged.queued.remove(stage.name()) {
                Some(units) if !units.is_empty() => units,
                _ => return Ok(()),
            },
        };
        if reads.is_none() {
            *staged.received.entry(stage.name().to_owned()).or_insert(0) += units.len() as u64;
        }
        let negatives = match reads {
            Some(reads) => self.negatives_for(reads, ledger, &mut state.shared),
            None => Negatives::default(),
        };
        let held = ActGate::default();
        let mut outcome = stage.run(
            &mut self.context(table, state, ledger, &negatives, &[], &held),
            units,
        )?;
        for litter in std::mem::take(&mut outcome.born) {
            let (to, placed) = self.adopt(stage.name(), table, litter, staged)?;
            let next = staged.queued.entry(to).or_default();
            next.extend_from_slice(&placed);
            next.sort_unstable();
        }
        if let Some(s) = outcome.stop
            && staged.stop == StopReason::Completed
        {
            staged.stop = s;
        }
        let mut queue = |to: String, units: &[usize]| {
            let next = staged.queued.entry(to).or_default();
            next.extend_from_slice(units);
            next.sort_unstable();
        };
        let escalated = &mut staged.escalated;
        if let Some(then) = shape.then {
            // An escalated unit this stage passes on is answered where it
            // goes (a tool's observed units, by the stage after it), unless
            // its fact here answers (a map's positives go on to add to it).
            for &i in &outcome.passed {
                if let Some(to) = escalated.get_mut(&i)
                    && to == stage.name()
                    && !ledger.has(i, stage.name())
                {
                    *to = then.to_owned();
                }
            }
            if reads.is_some() {
                escalated.extend(outcome.passed.iter().map(|&i| (i, then.to_owned())));
            }
            queue(then.to_owned(), &outcome.passed);
        }
        for (to, units) in outcome.escalated {
            escalated.extend(units.iter().map(|&i| (i, to.clone())));
            queue(to, &units);
        }
        for (to, units) in outcome.sent {
            queue(to, &units);
        }
        Ok(())
    }

    /// Adds the units one parent's observation bore to the table, after
    /// every unit it holds, at the parent's depth plus one, and returns
    /// the stage they go to with their positions. An id the table holds
    /// already is dropped as `taken`.
    fn adopt(
        &self,
        by: &str,
        table: &mut UnitTable,
        mut litter: Litter,
        staged: &mut Staged,
    ) -> Result<(String, Vec<usize>), RunError> {
        let parent_id = table.id(litter.parent)?.clone();
        let depth = table.depth(litter.parent) + 1;
        let ids = staged
            .ids
            .get_or_insert_with(|| table.units().iter().map(|u| u.unit_id.clone()).collect());
        let mut placed = Vec::with_capacity(litter.born.len());
        let mut kept = Vec::with_capacity(litter.born.len());
        for born in std::mem::take(&mut litter.born) {
            if !ids.insert(born.unit.unit_id.clone()) {
                litter
                    .dropped
                    .push((born.unit.unit_id.0.clone(), "taken".into()));
                continue;
            }
            let i = table.push_born(
                born.unit.clone(),
                &born.json,
                Lineage {
                    parent: litter.parent,
                    depth,
                    stage: by.to_owned(),
                },
            );
            self.budget.place(i, depth);
            placed.push(i);
            kept.push(born);
        }
        litter.born = kept;
        staged.nursery.note(parent_id.as_str(), &litter);
        Ok((litter.to, placed))
    }

    /// Model reducers: they read the answer's facts, never raw units. A
    /// run a breaker stopped has no answer worth reducing.
    pub fn reducers(
        &self,
        table: &UnitTable,
        state: &mut State,
        facts: &[(usize, FactRecord)],
        stop: &mut StopReason,
        phases: &mut Phases,
    ) -> Result<(), RunError> {
        for stage in self
            .plan
            .stages
            .iter()
            .filter(|s| s.shape().reads_facts().is_some())
        {
            if matches!(stop, StopReason::BreakerTripped { .. }) {
                break;
            }
            let ledger =
                FactLedger::new(self.store, Controller::new(crate::kit::no_contract()), None);
            let negatives = Negatives::default();
            let held = ActGate::default();
            let outcome = stage.run(
                &mut self.context(table, state, &ledger, &negatives, facts, &held),
                Vec::new(),
            )?;
            if let Some(s) = outcome.stop
                && *stop == StopReason::Completed
            {
                *stop = s;
            }
            phases.mark(&format!("{}:{}", stage.kind(), stage.name()));
        }
        Ok(())
    }

    /// Effects: the stages that act on the answer, once it is folded and
    /// verified, over the units it selected (`targets`, table positions)
    /// with the answer's facts. They never change the answer; what they
    /// did goes to their reports.
    pub fn effects(
        &self,
        table: &UnitTable,
        state: &mut State,
        targets: &[usize],
        facts: &[(usize, FactRecord)],
        act: &ActGate,
        phases: &mut Phases,
    ) -> Result<(), RunError> {
        for stage in self.plan.stages.iter().filter(|s| s.shape().reads_answer()) {
            let ledger =
                FactLedger::new(self.store, Controller::new(crate::kit::no_contract()), None);
            let negatives = Negatives::default();
            stage.run(
                &mut self.context(table, state, &ledger, &negatives, facts, act),
                targets.to_vec(),
            )?;
            phases.mark(&format!("{}:{}", stage.kind(), stage.name()));
        }
        Ok(())
    }

    /// What the rungs a stage reads threw away, how near each unit came to
    /// being kept, and what the answer holds so far.
    fn negatives_for(
        &self,
        reads: &NegativeReads,
        ledger: &FactLedger<'_>,
        shared: &mut Shared,
    ) -> Negatives {
        let mut out = Negatives::default();
        let published = shared.get::<UnitScores>();
        for rung in &reads.rungs {
            let units = if rung == fanfold_core::spec::PREFILTER_RUNG {
                RungUnits {
                    population: self.routed.excluded_by_reason.values().sum(),
                    units: self
                        .routed
                        .excluded_samples
                        .get(&reads.seed)
                        .cloned()
                        .unwrap_or_default(),
                    nearness: HashMap::new(),
                }
            } else {
                let units = ledger.negatives_of(rung);
                // A scoring stage's score says how near a unit came; a
                // judged one's confidence says how sure its negative is.
                let nearness = match published.as_ref().and_then(|p| p.of(rung)) {
                    Some(scores) => units
                        .iter()
                        .filter_map(|i| Some((*i, *scores.get(i)?)))
                        .collect(),
                    None => ledger
                        .confidences(rung)
                        .into_iter()
                        .map(|(i, c)| (i, 1.0 - c))
                        .collect(),
                };
                RungUnits {
                    population: units.len() as u64,
                    units,
                    nearness,
                }
            };
            out.rungs.insert(rung.clone(), units);
        }
        if !reads
            .rungs
            .iter()
            .any(|r| r == fanfold_core::spec::PREFILTER_RUNG)
        {
            out.elsewhere += self.routed.excluded_by_reason.values().sum::<u64>();
        }
        // A unit left undecided (abstain, error, not run) may be a
        // positive nobody found: it counts with what no rung read.
        ledger.for_each_latest(|_, stage, status| match status {
            Status::Positive => out.found += 1,
            Status::Negative if out.rungs.contains_key(stage) => {}
            _ => out.elsewhere += 1,
        });
        out
    }
}

/// An escalated unit's answer is the stage it was escalated to; the fact
/// that sent it there is kept in the store, not folded.
pub(super) fn keep_escalated_answers(
    facts: &mut Vec<(usize, FactRecord)>,
    escalated: &HashMap<usize, String>,
) {
    if escalated.is_empty() {
        return;
    }
    let answered: HashSet<usize> = facts
        .iter()
        .filter(|(i, f)| escalated.get(i) == Some(&f.stage))
        .map(|(i, _)| *i)
        .collect();
    facts.retain(|(i, f)| !answered.contains(i) || escalated.get(i) == Some(&f.stage));
}
