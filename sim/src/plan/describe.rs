//! How a [`Plan`] describes itself in words (topology, engine, workload, faults,
//! phases), and [`ms`] for the times in it. Not how a plan is drawn.

use crate::plan::build::Plan;
use crate::plan::fault::FaultKind;
use crate::scenario::CancelHow;
use kvsim_engine::config::RouterPolicy;
use kvsim_engine::ids::NodeId;
use std::fmt::Write;

impl Plan {
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let what = if self.swarm { "swarm draw" } else { "plan" };
        let _ = writeln!(out, "{what} for seed {} of {}:", self.seed, self.scenario);
        self.describe_topology(&mut out);
        self.describe_engine(&mut out);
        self.describe_workload(&mut out);
        self.describe_faults(&mut out);
        self.describe_phases(&mut out);
        if !self.reduction.is_empty() {
            let _ = writeln!(out, "  reduced:  {}", self.reduction);
        }
        out
    }

    /// The `topology:` line: the pools, a `*` on those below the context.
    fn describe_topology(&self, out: &mut String) {
        let e = &self.engine;
        let ps = u64::from(e.page_size);
        let pools = |ids: Vec<NodeId>, pools: &[u32]| -> String {
            ids.iter()
                .zip(pools)
                .map(|(id, p)| {
                    let small = u64::from(*p) * ps < e.context_len;
                    format!("{id} {p}p{}", if small { "*" } else { "" })
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "  topology: {} prefill ({}), {} decode ({}); page {} tokens, context {} tokens{}",
            self.prefill_pools.len(),
            pools(self.prefill_ids(), &self.prefill_pools),
            self.decode_pools.len(),
            pools(self.decode_ids(), &self.decode_pools),
            e.page_size,
            e.context_len,
            if e.allow_unsafe_pool {
                " (* pool below the context: the unsafe configuration, on purpose)"
            } else {
                ""
            }
        );
    }

    /// The `engine:` line: the router, the limits, the timeouts and the bug switches.
    fn describe_engine(&self, out: &mut String) {
        let e = &self.engine;
        let t = &e.timeouts;
        let _ = writeln!(
            out,
            "  engine:   {}chunk {} pages, {} writes in flight, {} rooms, batch {}; timeouts bootstrap {}, waiting {}, request {}, drain retry {} x{}; bugs {}",
            match e.router {
                RouterPolicy::Careful => String::new(),
                other => format!("router {}; ", other.name()),
            },
            e.chunk_pages,
            e.max_inflight_chunks,
            e.max_rooms,
            e.max_batch,
            ms(t.bootstrap_ns),
            ms(t.waiting_ns),
            ms(t.request_ns),
            ms(t.drain_retry_ns),
            t.drain_retries,
            e.bugs
        );
    }

    /// The `workload:` line: how many requests, their sizes, over-length and cancels.
    fn describe_workload(&self, out: &mut String) {
        let e = &self.engine;
        let ps = u64::from(e.page_size);
        let over = self
            .requests
            .iter()
            .filter(|r| {
                let need = r.prompt_len;
                self.prefill_pools
                    .iter()
                    .chain(&self.decode_pools)
                    .any(|&p| need > e.context_len.min(u64::from(p) * ps))
            })
            .count();
        let cancels = |how: CancelHow| {
            self.requests
                .iter()
                .filter(|r| r.cancel.is_some_and(|c| c.how == how))
                .count()
        };
        let (plo, phi) = self.requests.iter().fold((u64::MAX, 0), |(lo, hi), r| {
            (lo.min(r.prompt_len), hi.max(r.prompt_len))
        });
        let last = self.requests.iter().map(|r| r.at_ns).max().unwrap_or(0);
        let _ = writeln!(
            out,
            "  workload: {} requests from {} tenants over {}; prompts {}..{} tokens; {} over-length; {} client aborts, {} disconnects",
            self.requests.len(),
            self.tenants,
            ms(last),
            if plo == u64::MAX { 0 } else { plo },
            phi,
            over,
            cancels(CancelHow::Abort),
            cancels(CancelHow::Disconnect)
        );
    }

    /// The `faults:` line, then one line per partition window and crash.
    fn describe_faults(&self, out: &mut String) {
        let mut faults = Vec::new();
        for k in FaultKind::ALL {
            match self.level(k) {
                Some(level) => faults.push(self.fault_text(k, level)),
                None if !FaultKind::ALL[FaultKind::NEWER..].contains(&k) => {
                    faults.push(format!("{k} off"))
                }
                None => {}
            }
        }
        let _ = writeln!(out, "  faults:   {}", faults.join(", "));
        for p in &self.partitions {
            let _ = writeln!(
                out,
                "            partition {} | {} from {} to {}",
                p.prefill,
                p.decode,
                ms(p.from_ns),
                ms(p.until_ns)
            );
        }
        for c in &self.crashes {
            let _ = writeln!(
                out,
                "            crash {} at {}, restart at {}",
                c.node,
                ms(c.at_ns),
                ms(c.restart_ns)
            );
        }
        for p in &self.pauses {
            let when = if p.on_transfer {
                "at its first transfer step after"
            } else {
                "at"
            };
            let _ = writeln!(
                out,
                "            pause {} {when} {}, for {}",
                p.node,
                ms(p.at_ns),
                ms(p.len_ns)
            );
        }
    }

    /// One fault kind that is on, with its drawn rates.
    fn fault_text(&self, k: FaultKind, level: u32) -> String {
        let n = &self.net;
        match k {
            FaultKind::Delay => {
                format!("delay {}‰ up to {}", n.delay_permille, ms(n.delay_max_ns))
            }
            FaultKind::Loss => format!("loss {}‰", n.loss_permille),
            FaultKind::Duplicate => format!("duplicate {}‰", n.duplicate_permille),
            FaultKind::Reorder => format!("reorder jitter {}", ms(n.jitter_ns)),
            FaultKind::Partition => format!("partition x{}", self.partitions.len()),
            FaultKind::SlowWrite => format!(
                "slow-write {}‰ up to {}",
                n.slow_write_permille,
                ms(n.slow_write_max_ns)
            ),
            FaultKind::LateWrite => format!(
                "late-write {}‰ up to {}",
                n.late_write_permille,
                ms(n.late_write_max_ns)
            ),
            FaultKind::WriteFail => format!("write-fail {}‰", n.write_fail_permille),
            FaultKind::Crash => format!("crash x{}", self.crashes.len()),
            FaultKind::Cancel => format!("cancel level {level}‰"),
            FaultKind::ShortTimeouts => format!("short-timeouts level {level}‰"),
            FaultKind::CorruptWrite => format!("corrupt-write {}‰", n.corrupt_write_permille),
            FaultKind::MisdirectWrite => {
                format!("misdirect-write {}‰", n.misdirect_write_permille)
            }
            FaultKind::TornWrite => format!("torn-write {}‰", n.torn_write_permille),
            FaultKind::StaleReplay => format!("stale-replay {}‰", n.stale_replay_permille),
            FaultKind::ClientRoom => format!("client-room {}‰", n.client_room_permille),
            FaultKind::StaleDuplicateWrite => format!(
                "stale-duplicate-write {}‰",
                n.stale_duplicate_write_permille
            ),
            FaultKind::Pause => format!("pause x{}", self.pauses.len()),
            FaultKind::ClockSkew => match self.clocks.describe() {
                s if s.is_empty() => "clock-skew (every clock true)".into(),
                s => format!("clock-skew {s}"),
            },
            FaultKind::SlowWriter => match self.slow_writer {
                Some((node, ns)) => format!("slow-writer {node} +{}", ms(ns)),
                None => "slow-writer off".into(),
            },
        }
    }

    /// The `phases:` line: when faults heal and when everything must have drained.
    fn describe_phases(&self, out: &mut String) {
        match self.heal_at_ns {
            Some(h) => {
                let _ = writeln!(
                    out,
                    "  phases:   safety (faults on) until {}, then liveness: everything drained by {}",
                    ms(h),
                    ms(self.deadline_ns)
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "  phases:   no faults; everything drained by {}",
                    ms(self.deadline_ns)
                );
            }
        }
    }
}

/// Nanoseconds as a short human duration.
pub fn ms(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!(
            "{}.{:03}s",
            ns / 1_000_000_000,
            (ns % 1_000_000_000) / 1_000_000
        )
    } else if ns >= 1_000_000 {
        format!("{}ms", ns / 1_000_000)
    } else {
        format!("{}us", ns / 1_000)
    }
}
