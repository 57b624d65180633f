//! A node's trace files across its incarnations: the file a new incarnation writes
//! ([`open_tracer`]), which first ends the killed one's (its torn last record cut,
//! its open writes flushed, the rooms it held let go), and the refusal of an epoch
//! already used. Not the trace file's writing ([`crate::trace`]) nor the restart in
//! process (`NodeLoop::restart`).

use crate::server::options::{ServeError, ServeOptions};
use crate::trace::Tracer;
use kvsim_engine::ids::{NodeId, WriteId};
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::worker::LeftOpen;
use kvsim_engine::world::WritesInFlight;
use kvsim_oracle::schema::{EndOutcome, FaultEvent, Record};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Node `id`'s trace files under `dir`, by the epoch each process started with
/// (`n<ID>-e<EPOCH>.jsonl`).
fn trace_files(dir: &std::path::Path, id: NodeId) -> BTreeMap<u32, PathBuf> {
    let prefix = format!("n{}-e", id.0);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    let files: BTreeMap<u32, PathBuf> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let epoch = name
                .strip_prefix(&prefix)?
                .strip_suffix(".jsonl")?
                .parse()
                .ok()?;
            Some((epoch, e.path()))
        })
        .collect();
    debug_assert!(files.values().all(|p| p.starts_with(dir)));
    files
}

/// How a process of a node ended, as its trace file tells.
struct Ended {
    /// The last incarnation it ran (a restart in process moves it on).
    last: u32,
    /// The KV writes that incarnation posted and never saw complete.
    flushed: Vec<WriteId>,
    /// Worker mode, decode: what the next process records for the rooms its worker
    /// front opened and never cleared (the engine's rule, [`LeftOpen`]).
    cleared: Vec<TraceEvent>,
}

/// How a process of node `id` ended, as its trace file tells ([`Ended`]); the writes
/// are replayed through the runtime's own in-flight record ([`WritesInFlight`]): its
/// NIC's queue, flushed with it (the receiver drops a write whose connection has
/// closed, `world::arrival`'s `SenderCrashed`).
fn replay_incarnations(path: &std::path::Path, id: NodeId, started: u32) -> Ended {
    use std::io::BufRead as _;
    let (mut last, mut writes) = (started, WritesInFlight::new());
    let mut open = LeftOpen::new(id);
    let Ok(f) = std::fs::File::open(path) else {
        return Ended {
            last,
            flushed: Vec::new(),
            cleared: Vec::new(),
        };
    };
    for line in std::io::BufReader::new(f).lines().map_while(Result::ok) {
        let Ok(kvsim_oracle::schema::Line::Entry(e)) = kvsim_oracle::schema::parse_line(&line)
        else {
            continue;
        };
        match e.rec {
            // A write traced without its receiver (an older trace) cannot be followed.
            Record::Engine(TraceEvent::KvSent {
                write,
                to: Some(to),
                ..
            }) => writes.post_id(to, write),
            Record::Engine(TraceEvent::WriteCompleted { write, .. }) => {
                let to = writes.iter().find(|(_, w)| *w == write).map(|(to, _)| to);
                if let Some(to) = to {
                    writes.complete(to, write);
                }
            }
            Record::WriteFailed { to, write, .. } => {
                writes.fail(to, write);
            }
            // An in-process restart: that incarnation's crash record listed its writes.
            Record::Fault(FaultEvent::Crash { .. }) => {
                writes.crash();
            }
            Record::Fault(FaultEvent::Restart { epoch, .. }) => last = last.max(epoch),
            Record::Engine(ev) => open.event(&ev),
            _ => {}
        }
    }
    Ended {
        last,
        flushed: writes.crash(),
        cleared: open.cleared(),
    }
}

/// A killed process wrote no end to its trace: its successor appends one, so the audit
/// judges the run's end by the files of the incarnations still running (the node's pool
/// and rooms continue in the new epoch's file, after its `crash` and `restart` records).
/// A record the kill cut part way (the file does not end with a line's end) never
/// reached the file whole: it is cut off, and the end says so. By write-ahead nothing
/// it caused left the process (a message leaves only after its causes were written
/// out whole), so no other node's trace depends on it.
fn end_killed_process(path: &std::path::Path, id: NodeId, dead: u32) {
    use std::io::Write as _;
    // Appends go to the file's end, wherever the cut below left the cursor.
    let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .open(path)
    else {
        return;
    };
    let torn = cut_torn_tail(&mut f).unwrap_or_else(|err| {
        eprintln!(
            "kvsim serve: cannot read the end of {}: {err}",
            path.display()
        );
        0
    });
    let e = kvsim_oracle::schema::Entry {
        at_ns: crate::clock::wall_ns(),
        seq: 0,
        rec: Record::End {
            outcome: EndOutcome::Drained,
            detail: format!(
                "incarnation {dead} was killed; node {id} continues as incarnation {}{}",
                dead + 1,
                if torn > 0 {
                    format!(
                        " (its last record, cut part way by the kill, was dropped: {torn} bytes)"
                    )
                } else {
                    String::new()
                }
            ),
        },
    };
    if let Err(err) = writeln!(f, "{}", kvsim_oracle::schema::entry_line(&e)) {
        eprintln!("kvsim serve: cannot end {}: {err}", path.display());
    }
}

/// Cut what follows the last line's end of `f` (a record a kill cut part way); the
/// bytes cut.
fn cut_torn_tail(f: &mut std::fs::File) -> std::io::Result<u64> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let len = f.metadata()?.len();
    let mut at = len;
    let mut buf = [0u8; 4096];
    while at > 0 {
        let n = buf.len().min(at as usize);
        f.seek(SeekFrom::Start(at - n as u64))?;
        f.read_exact(&mut buf[..n])?;
        match buf[..n].iter().rposition(|b| *b == b'\n') {
            Some(i) => {
                let keep = at - n as u64 + i as u64 + 1;
                if keep < len {
                    f.set_len(keep)?;
                }
                return Ok(len - keep);
            }
            None => at -= n as u64,
        }
    }
    // Not one whole line: not even the header; leave it for the audit to name.
    Ok(0)
}

/// Node `id`'s trace file under `--trace-json` (none without it). A restarted
/// incarnation (`epoch > 0`) first records the previous one's end: it is gone
/// (killed), its open writes flushed, and every tag it handed out is stale. An epoch
/// names one incarnation: a restart at an epoch the node's trace files already name
/// (a process started at it or above, or a restart in process that reached it) is
/// refused ([`ServeError::EpochUsed`]).
pub(super) fn open_tracer(
    opts: &ServeOptions,
    id: NodeId,
    epoch: u32,
) -> Result<Option<Tracer>, ServeError> {
    let Some(dir) = &opts.trace_dir else {
        return Ok(None);
    };
    let path = dir.join(format!("n{}-e{}.jsonl", id.0, epoch));
    let files = trace_files(dir, id);
    let mut ended = None;
    if epoch > 0 {
        if let Some((&used, file)) = files.range(epoch..).next_back() {
            return Err(epoch_used(id, epoch, used, file));
        }
        if let Some((&started, file)) = files.range(..epoch).next_back() {
            let end = replay_incarnations(file, id, started);
            if end.last >= epoch {
                return Err(epoch_used(id, epoch, end.last, file));
            }
            ended = Some((file.clone(), end));
        }
    }
    let mut t = Tracer::create(&path, &opts.header()).map_err(|source| ServeError::Trace {
        path: path.display().to_string(),
        source,
    })?;
    if epoch > 0 {
        let (dead, flushed, cleared) = match ended {
            Some((file, end)) => {
                end_killed_process(&file, id, end.last);
                (end.last, end.flushed, end.cleared)
            }
            None => (epoch - 1, Vec::new(), Vec::new()),
        };
        debug_assert!(dead < epoch, "the new incarnation is above the dead one");
        t.write(Record::Fault(FaultEvent::Crash {
            node: id,
            epoch: dead,
            flushed,
        }));
        t.write(Record::Fault(FaultEvent::Restart { node: id, epoch }));
        // Worker mode, decode: the rooms the killed process's front left open are
        // cleared (the engine's rule, `LeftOpen::cleared`).
        for ev in cleared {
            t.write(Record::Engine(ev));
        }
    }
    Ok(Some(t))
}

fn epoch_used(node: NodeId, epoch: u32, used: u32, file: &std::path::Path) -> ServeError {
    ServeError::EpochUsed {
        node,
        epoch,
        used,
        trace: file.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::options::PromptMode;
    use kvsim_engine::config::EngineConfig;
    use kvsim_engine::ids::{RequestId, RoomKey, TenantId};
    use kvsim_engine::world::{Topology, ROUTER};
    use kvsim_oracle::schema::{entry_line, header_line, parse_line, Entry, Line};

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kvsim-server-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("a temporary folder");
        d
    }

    fn opts(trace_dir: &std::path::Path) -> ServeOptions {
        ServeOptions {
            cfg: EngineConfig::default(),
            topology: Topology {
                prefill_pools: vec![32],
                decode_pools: vec![128],
            },
            trace_dir: Some(trace_dir.to_path_buf()),
            scenario: "t".into(),
            seed: 0,
            prompts: PromptMode::Own,
            worker: true,
            node_invariants: true,
            kv_wire: Default::default(),
        }
    }

    fn line(seq: u64, ev: TraceEvent) -> String {
        entry_line(&Entry {
            at_ns: seq,
            seq,
            rec: Record::Engine(ev),
        }) + "\n"
    }

    fn routed(room: RoomKey) -> TraceEvent {
        TraceEvent::Routed {
            node: ROUTER,
            req: RequestId(room.gen.0),
            tenant: TenantId(0),
            room,
            prefill: NodeId(1),
            decode: NodeId(2),
            prompt_len: 4,
            max_new_tokens: 2,
        }
    }

    #[test]
    fn a_torn_last_record_is_cut() {
        let d = dir("torn");
        let p = d.join("f");
        std::fs::write(&p, "a\nb\n{\"at_ns\":1,\"se").expect("written");
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .expect("opened");
        assert_eq!(cut_torn_tail(&mut f).expect("cut"), 14);
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "a\nb\n");
        assert_eq!(cut_torn_tail(&mut f).expect("cut"), 0, "a whole file stays");
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "a\nb\n");
    }

    /// A decode process killed in worker mode: its successor ends the dead one's file
    /// (its torn last record cut, so the file still reads), and begins its own with the
    /// crash, the restart, and the clearing of the rooms the dead process's stand-in
    /// for the router had open (and only those).
    #[test]
    fn a_killed_decode_process_is_ended_by_its_successor() {
        let d = dir("killed");
        let o = opts(&d);
        let (open, closed) = (RoomKey::new(5, 55), RoomKey::new(6, 66));
        let dead = header_line(&o.header())
            + "\n"
            + &line(1, routed(open))
            + &line(2, routed(closed))
            + &line(
                3,
                TraceEvent::RoomCleared {
                    node: ROUTER,
                    room: closed,
                },
            )
            + "{\"at_ns\":4,\"seq\":4,\"ty";
        std::fs::write(d.join("n2-e0.jsonl"), dead).expect("written");
        let t = open_tracer(&o, NodeId(2), 1).expect("a tracer");
        drop(t);
        let old = std::fs::read_to_string(d.join("n2-e0.jsonl")).expect("read");
        let last = old.lines().last().expect("a line");
        assert!(
            last.contains("incarnation 0 was killed") && last.contains("cut part way"),
            "{last}"
        );
        for l in old.lines() {
            parse_line(l).unwrap_or_else(|e| panic!("{l}: {e:?}"));
        }
        let new = std::fs::read_to_string(d.join("n2-e1.jsonl")).expect("read");
        let recs: Vec<Record> = new
            .lines()
            .filter_map(|l| match parse_line(l) {
                Ok(Line::Entry(e)) => Some(e.rec),
                _ => None,
            })
            .collect();
        assert!(matches!(
            recs.first(),
            Some(Record::Fault(FaultEvent::Crash { epoch: 0, .. }))
        ));
        assert!(matches!(
            recs.get(1),
            Some(Record::Fault(FaultEvent::Restart { epoch: 1, .. }))
        ));
        let cleared: Vec<RoomKey> = recs
            .iter()
            .filter_map(|r| match r {
                Record::Engine(TraceEvent::RoomCleared { room, .. }) => Some(*room),
                _ => None,
            })
            .collect();
        assert_eq!(cleared, vec![open]);
    }
}
