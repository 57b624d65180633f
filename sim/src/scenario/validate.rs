//! Whether a scenario holds together: every stated relation between its fields,
//! its memory and cost budgets, its topology, requests, workload, faults and
//! swarm. Each failure is a [`ScenarioError`] naming the field. Not parsing.

use crate::scenario::request::{ReqPhase, MAX_REQUESTS};
use crate::scenario::spec::{
    kv_bytes_per_page, Scenario, ScenarioError, SwarmSpec, WorkloadSpec, COST_BUDGET_TOKENS,
    MAX_KV_BYTES, MAX_TIME_MS,
};

impl Scenario {
    fn invalid(field: impl Into<String>, reason: impl Into<String>) -> ScenarioError {
        ScenarioError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Every duration of the scenario, named as in the file, in its file unit, with
    /// the factor that turns it into milliseconds over 1000 (1 for microseconds).
    fn durations(&self) -> Vec<(String, u64, u64)> {
        let f = &self.faults;
        let mut v = vec![
            ("network.latency_us".to_string(), self.network.latency_us, 1),
            ("faults.delay.max_ms".into(), f.delay.max_ms, 1000),
            ("faults.reorder_jitter_us".into(), f.reorder_jitter_us, 1),
            ("faults.partition.max_ms".into(), f.partition.max_ms, 1000),
            ("faults.slow_write.max_ms".into(), f.slow_write.max_ms, 1000),
            ("faults.late_write.max_ms".into(), f.late_write.max_ms, 1000),
            ("faults.crash.max_ms".into(), f.crash.max_ms, 1000),
            ("faults.pause.max_ms".into(), f.pause.max_ms, 1000),
            (
                "faults.short_timeouts_min_ms".into(),
                f.short_timeouts_min_ms,
                1000,
            ),
            ("phases.safety_ms".into(), self.phases.safety_ms, 1000),
            ("phases.liveness_ms".into(), self.phases.liveness_ms, 1000),
            ("run.max_time_ms".into(), self.run.max_time_ms, 1000),
            (
                "run.cleanup_bound_ms".into(),
                self.run.cleanup_bound_ms,
                1000,
            ),
        ];
        if let Some(w) = &self.workload {
            v.push(("workload.arrival_ms".into(), w.arrival_ms, 1000));
        }
        for (i, r) in self.requests.iter().enumerate() {
            v.push((format!("requests[{i}].at_us"), r.at_us, 1));
            v.push((format!("requests[{i}].every_us"), r.every_us, 1));
            v.push((
                format!("requests[{i}].cancel_delay_us"),
                r.cancel_delay_us,
                1,
            ));
            if let Some(c) = r.cancel_after_us {
                v.push((format!("requests[{i}].cancel_after_us"), c, 1));
            }
        }
        v
    }

    /// The pages of KV memory a run of this scenario may allocate at most, over all
    /// its nodes (under a swarm: the largest draw).
    pub fn max_pool_pages(&self) -> u64 {
        match &self.swarm {
            None => self
                .topology
                .prefill_pool_pages
                .iter()
                .chain(&self.topology.decode_pool_pages)
                .map(|&p| u64::from(p) + 1)
                .sum(),
            Some(sw) => {
                let nodes = u64::from(sw.prefill_nodes[1]) + u64::from(sw.decode_nodes[1]);
                let mut largest = u64::from(sw.pool_pages[1]);
                if sw.pool_below_context_permille > 0 {
                    let context_pages = self.engine.pages_for(self.engine.context_len);
                    largest = largest.max(context_pages.saturating_sub(1));
                }
                nodes.saturating_mul(largest.saturating_add(1))
            }
        }
    }

    /// Refuse a scenario whose KV pools would not fit [`MAX_KV_BYTES`] on the given
    /// backend (`host`: real f32 arithmetic, far larger per page).
    pub fn check_memory(&self, host: bool) -> Result<(), ScenarioError> {
        let pages = self.max_pool_pages();
        let bytes = pages.saturating_mul(kv_bytes_per_page(self.engine.page_size, host));
        if bytes > MAX_KV_BYTES {
            return Err(ScenarioError::TooMuchMemory {
                mib: bytes >> 20,
                pages,
                page_size: self.engine.page_size,
                backend: if host { "host" } else { "symbolic" },
                budget_mib: MAX_KV_BYTES >> 20,
            });
        }
        Ok(())
    }

    /// An upper bound on the prompt and generated tokens of one run, and its requests.
    pub fn cost_estimate(&self) -> (u64, u64) {
        let mut tokens = 0u64;
        let mut requests = 0u64;
        for r in &self.requests {
            let each = r.prompt_len.saturating_add(u64::from(r.max_new_tokens));
            tokens = tokens.saturating_add(each.saturating_mul(u64::from(r.repeat)));
            requests = requests.saturating_add(u64::from(r.repeat));
        }
        if let Some(w) = &self.workload {
            // An over-length prompt is at most a quarter over the largest pool or context.
            let over = if w.over_length_permille > 0 {
                (1u64 << 24).min(self.engine.context_len.saturating_mul(5) / 4)
            } else {
                0
            };
            let each = w.prompt_len[1]
                .max(over)
                .saturating_add(u64::from(w.max_new_tokens[1]));
            tokens = tokens.saturating_add(each.saturating_mul(u64::from(w.requests)));
            requests = requests.saturating_add(u64::from(w.requests));
        }
        (tokens, requests)
    }

    /// Refuse a scenario whose [`Scenario::cost_estimate`] exceeds
    /// [`COST_BUDGET_TOKENS`] (the CLI's `--allow-expensive` skips this check).
    pub fn check_cost(&self) -> Result<(), ScenarioError> {
        let (tokens, requests) = self.cost_estimate();
        if tokens > COST_BUDGET_TOKENS {
            return Err(ScenarioError::Expensive {
                tokens,
                requests,
                budget: COST_BUDGET_TOKENS,
            });
        }
        Ok(())
    }

    /// Check every relation the engine config does not cover.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        self.engine.validate()?;
        self.validate_durations()?;
        self.validate_routers()?;
        self.validate_worker_mode()?;
        self.validate_reach()?;
        if self.run.max_time_ms == 0 {
            return Err(Self::invalid(
                "run.max_time_ms",
                "must be at least 1: a run with no time checks nothing",
            ));
        }
        self.validate_topology()?;
        self.validate_requests()?;
        if let Some(w) = &self.workload {
            self.validate_workload(w)?;
        }
        self.validate_faults()?;
        if let Some(sw) = &self.swarm {
            Self::validate_swarm(sw)?;
        }
        self.validate_total()?;
        if self.run.max_events == 0 {
            return Err(Self::invalid("run.max_events", "must be at least 1"));
        }
        self.check_memory(false)?;
        Ok(())
    }

    /// Every duration within the simulated time bound (30 days).
    fn validate_durations(&self) -> Result<(), ScenarioError> {
        for (field, v, per_ms) in self.durations() {
            let max = MAX_TIME_MS.saturating_mul(1000 / per_ms);
            if v > max {
                let unit = if per_ms == 1 { "us" } else { "ms" };
                return Err(Self::invalid(
                    field,
                    format!("{v}{unit}: at most {max}{unit} (30 days of simulated time)"),
                ));
            }
        }
        Ok(())
    }

    /// Each router policy listed once.
    fn validate_routers(&self) -> Result<(), ScenarioError> {
        let mut routers = self.routers.clone();
        routers.sort();
        routers.dedup();
        if routers.len() != self.routers.len() {
            return Err(Self::invalid(
                "routers",
                "lists a router policy twice (each seed draws one of them)",
            ));
        }
        Ok(())
    }

    /// `topology.worker_mode`: the real router in front of worker fronts is the
    /// engine router of policy `sglang-router`, on a topology as written.
    fn validate_worker_mode(&self) -> Result<(), ScenarioError> {
        if !self.topology.worker_mode {
            return Ok(());
        }
        let sglang = kvsim_engine::RouterPolicy::SglangRouter;
        let only_sglang = match self.routers.is_empty() {
            true => self.engine.router == sglang,
            false => self.routers.iter().all(|r| *r == sglang),
        };
        if !only_sglang || self.swarm.is_some() {
            return Err(Self::invalid(
                "topology.worker_mode",
                "worker fronts stand behind the sglang-router policy only (routers = \
                 [\"sglang-router\"]), on a topology as written (no [swarm])",
            ));
        }
        Ok(())
    }

    /// `reach`: known path names, each listed once.
    fn validate_reach(&self) -> Result<(), ScenarioError> {
        for (i, name) in self.reach.iter().enumerate() {
            if crate::reach::ReachPath::parse(name).is_none() {
                return Err(Self::invalid(
                    format!("reach[{i}]"),
                    format!(
                        "unknown path `{name}` (known: {})",
                        crate::reach::ReachPath::names()
                    ),
                ));
            }
            if self.reach[..i].contains(name) {
                return Err(Self::invalid(
                    format!("reach[{i}]"),
                    format!("lists `{name}` twice"),
                ));
            }
        }
        Ok(())
    }

    /// The paths of `reach`, parsed (a validated scenario names only known ones).
    pub fn reach_paths(&self) -> Vec<crate::reach::ReachPath> {
        self.reach
            .iter()
            .filter_map(|n| crate::reach::ReachPath::parse(n))
            .collect()
    }

    /// `[topology]`: present exactly when there is no `[swarm]`, 1 to 64 nodes of
    /// each kind, each pool 1 to 2^24 pages.
    fn validate_topology(&self) -> Result<(), ScenarioError> {
        let t = &self.topology;
        if self.swarm.is_some()
            && (!t.prefill_pool_pages.is_empty() || !t.decode_pool_pages.is_empty())
        {
            return Err(Self::invalid(
                "topology",
                "a [swarm] draws the topology: remove [topology] or [swarm]",
            ));
        }
        if self.swarm.is_none() {
            if t.prefill_pool_pages.is_empty() || t.prefill_pool_pages.len() > 64 {
                return Err(Self::invalid(
                    "topology.prefill_pool_pages",
                    "needs 1 to 64 nodes",
                ));
            }
            if t.decode_pool_pages.is_empty() || t.decode_pool_pages.len() > 64 {
                return Err(Self::invalid(
                    "topology.decode_pool_pages",
                    "needs 1 to 64 nodes",
                ));
            }
            let named = t
                .prefill_pool_pages
                .iter()
                .enumerate()
                .map(|(i, p)| (format!("topology.prefill_pool_pages[{i}]"), *p))
                .chain(
                    t.decode_pool_pages
                        .iter()
                        .enumerate()
                        .map(|(i, p)| (format!("topology.decode_pool_pages[{i}]"), *p)),
                );
            for (field, p) in named {
                if p == 0 || p > 1 << 24 {
                    return Err(Self::invalid(
                        field,
                        format!("{p} pages: a pool has 1 to 16777216 pages"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `[[requests]]`: sizes, repeats, times within the bound, known cancel phases.
    fn validate_requests(&self) -> Result<(), ScenarioError> {
        for (i, r) in self.requests.iter().enumerate() {
            let f = |name: &str| format!("requests[{i}].{name}");
            if r.prompt_len == 0 || r.prompt_len > 1 << 24 {
                return Err(Self::invalid(
                    f("prompt_len"),
                    "must be 1 to 16777216 tokens",
                ));
            }
            if r.max_new_tokens == 0 {
                return Err(Self::invalid(f("max_new_tokens"), "must be at least 1"));
            }
            if r.repeat == 0 {
                return Err(Self::invalid(f("repeat"), "must be at least 1"));
            }
            // The last copy's submit time, and its cancel, stay inside the time bound.
            let last = u64::from(r.repeat - 1)
                .checked_mul(r.every_us)
                .and_then(|x| x.checked_add(r.at_us))
                .and_then(|x| x.checked_add(r.cancel_after_us.unwrap_or(0)))
                .and_then(|x| x.checked_add(r.cancel_delay_us))
                .filter(|&x| x <= MAX_TIME_MS * 1000);
            if last.is_none() {
                return Err(Self::invalid(
                    f("every_us"),
                    format!(
                        "at_us + (repeat - 1) * every_us + cancel delays must be at most {}us (30 days)",
                        MAX_TIME_MS * 1000
                    ),
                ));
            }
            if let Some(p) = &r.cancel_on {
                if ReqPhase::parse(p).is_none() {
                    return Err(Self::invalid(
                        f("cancel_on"),
                        format!("unknown phase `{p}` (known: prefill-admitted, decode-reserved, kv-sent, kv-landed, transfer-accepted, decoding[:N], prefill-answered, answered)"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `[workload]`: ranges ordered and within the engine's limits.
    fn validate_workload(&self, w: &WorkloadSpec) -> Result<(), ScenarioError> {
        let f = |name: &str| format!("workload.{name}");
        if w.prompt_len[0] == 0 || w.prompt_len[0] > w.prompt_len[1] || w.prompt_len[1] > 1 << 24 {
            return Err(Self::invalid(
                f("prompt_len"),
                "needs 1 <= low <= high <= 16777216",
            ));
        }
        if w.max_new_tokens[0] == 0 || w.max_new_tokens[0] > w.max_new_tokens[1] {
            return Err(Self::invalid(f("max_new_tokens"), "needs 1 <= low <= high"));
        }
        if w.max_new_tokens[1] > self.engine.max_new_tokens_limit {
            return Err(Self::invalid(
                f("max_new_tokens"),
                format!(
                    "exceeds engine.max_new_tokens_limit ({})",
                    self.engine.max_new_tokens_limit
                ),
            ));
        }
        if w.tenants == 0 || w.tenants > 1 << 16 {
            return Err(Self::invalid(f("tenants"), "must be 1 to 65536"));
        }
        if w.burst == 0 || w.burst > MAX_REQUESTS as u32 {
            return Err(Self::invalid(
                f("burst"),
                format!("must be 1 to {MAX_REQUESTS}"),
            ));
        }
        if w.over_length_permille > 1000 {
            return Err(Self::invalid(f("over_length_permille"), "at most 1000"));
        }
        Ok(())
    }

    /// `[faults]`: rates per mille, known cancel phases, bounded counts.
    fn validate_faults(&self) -> Result<(), ScenarioError> {
        let fs = &self.faults;
        for (name, v) in [
            ("delay.permille", fs.delay.permille),
            ("loss_permille", fs.loss_permille),
            ("duplicate_permille", fs.duplicate_permille),
            ("stale_replay_permille", fs.stale_replay_permille),
            ("client_room_permille", fs.client_room_permille),
            ("slow_write.permille", fs.slow_write.permille),
            ("late_write.permille", fs.late_write.permille),
            ("write_fail_permille", fs.write_fail_permille),
            ("corrupt_write_permille", fs.corrupt_write_permille),
            ("misdirect_write_permille", fs.misdirect_write_permille),
            ("torn_write_permille", fs.torn_write_permille),
            (
                "stale_duplicate_write_permille",
                fs.stale_duplicate_write_permille,
            ),
            ("cancel_permille", fs.cancel_permille),
        ] {
            if v > 1000 {
                return Err(Self::invalid(format!("faults.{name}"), "at most 1000"));
            }
        }
        for p in &fs.cancel_phases {
            if ReqPhase::parse(p).is_none() {
                return Err(Self::invalid(
                    "faults.cancel_phases",
                    format!("unknown phase `{p}`"),
                ));
            }
        }
        // A lost message is recovered by a retry; losing every one would only test
        // that nothing can be done.
        if fs.loss_permille > 500 {
            return Err(Self::invalid("faults.loss_permille", "at most 500"));
        }
        if fs.partition.count > 64 || fs.crash.count > 64 || fs.pause.count > 64 {
            return Err(Self::invalid(
                "faults",
                "at most 64 partitions, 64 crashes and 64 pauses",
            ));
        }
        // A clock at rate 0 never fires a timer: no timeout could end anything.
        if fs.clock_skew_permille > 900 {
            return Err(Self::invalid(
                "faults.clock_skew_permille",
                "at most 900 (a clock running at 10% of the true rate or faster)",
            ));
        }
        Ok(())
    }

    /// `[swarm]`: ranges ordered and within the engine's bounds.
    fn validate_swarm(sw: &SwarmSpec) -> Result<(), ScenarioError> {
        for (name, r) in [
            ("prefill_nodes", sw.prefill_nodes),
            ("decode_nodes", sw.decode_nodes),
            ("pool_pages", sw.pool_pages),
            ("chunk_pages", sw.chunk_pages),
            ("max_inflight_chunks", sw.max_inflight_chunks),
            ("max_rooms", sw.max_rooms),
            ("max_batch", sw.max_batch),
        ] {
            if r[0] == 0 || r[0] > r[1] {
                return Err(Self::invalid(
                    format!("swarm.{name}"),
                    "needs 1 <= low <= high",
                ));
            }
        }
        if sw.prefill_nodes[1] > 64 || sw.decode_nodes[1] > 64 {
            return Err(Self::invalid(
                "swarm",
                "at most 64 prefill and 64 decode nodes",
            ));
        }
        if sw.pool_pages[1] > 1 << 24 {
            return Err(Self::invalid("swarm.pool_pages", "at most 16777216 pages"));
        }
        use kvsim_engine::config::{MAX_CHUNK_PAGES, MAX_QUEUE, MAX_ROOMS};
        for (name, hi, max) in [
            ("max_rooms", sw.max_rooms[1], MAX_ROOMS),
            ("chunk_pages", sw.chunk_pages[1], MAX_CHUNK_PAGES),
            ("max_batch", sw.max_batch[1], MAX_QUEUE),
        ] {
            if hi > max {
                return Err(Self::invalid(
                    format!("swarm.{name}"),
                    format!("{hi}: at most {max} (the engine's bound)"),
                ));
            }
        }
        if sw.max_inflight_chunks[1] > 1024 {
            return Err(Self::invalid("swarm.max_inflight_chunks", "at most 1024"));
        }
        if sw.pool_below_context_permille > 1000 {
            return Err(Self::invalid(
                "swarm.pool_below_context_permille",
                "at most 1000",
            ));
        }
        if sw.small_pool_pages_min == 0 {
            return Err(Self::invalid(
                "swarm.small_pool_pages_min",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// The scenario submits at least one request and at most [`MAX_REQUESTS`].
    fn validate_total(&self) -> Result<(), ScenarioError> {
        let explicit: usize = self.requests.iter().map(|r| r.repeat as usize).sum();
        let total = explicit + self.workload.as_ref().map_or(0, |w| w.requests as usize);
        if total == 0 {
            return Err(Self::invalid(
                "requests",
                "the scenario submits no request (no [[requests]] and no [workload] with requests > 0): a run would check nothing",
            ));
        }
        if total > MAX_REQUESTS {
            return Err(Self::invalid(
                "requests",
                format!("{total} requests; at most {MAX_REQUESTS}"),
            ));
        }
        Ok(())
    }
}
