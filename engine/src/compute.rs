//! Compute as an effect: the device work a node asks for ([`Job`]) and what the device
//! did ([`Done`]), which comes back to the node as [`crate::env::Input::Computed`].
//!
//! A handler never runs device work itself: it emits [`crate::env::Effect::Compute`],
//! and the driver carries the job out through [`crate::world::step`] (in the same step
//! in the simulator, the model checker and the harness; on the node's device thread in
//! the hardware runtime, whose loop waits for the completion before its next input).
//! What the device does with a job is stated here once ([`Job::run`]); what the node
//! does with the result is its completion handler (docs/DECISIONS.md, "Compute as an
//! effect").

use crate::gpu::{ids, DeviceError, Gpu, TagError, WriteError};
use crate::ids::{PageTag, RoomKey, Token};

/// The device work of one room. It holds no KV payload and no node state: tags,
/// positions and tokens only.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Job {
    /// One decode step of `room`.
    DecodeStep(StepJob),
    /// Prefill's forward of `room`: its prompt's KV into its source pages.
    Forward(ForwardJob),
}

/// Prefill's forward of one room: the KV of `prompt` at positions `0..` of `pages`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct ForwardJob {
    pub room: RoomKey,
    pub pages: Vec<PageTag>,
    pub prompt: Vec<Token>,
}

/// One decode step: the tag check (defense 4, `check` is `None` with it off), echo
/// attention over `pages` at `query_pos`, then the new token's KV at position
/// `seq_len` of `write` (the room's own pages).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct StepJob {
    pub room: RoomKey,
    /// The step's index, as the node had it when it issued the job.
    pub step: u32,
    pub seq_len: u64,
    pub query_pos: u64,
    /// The pages attention reads (the sequence's pages).
    pub pages: Vec<PageTag>,
    /// Whether the tags of `pages` are checked before they are read.
    pub check_tags: bool,
    /// Every page of the room: the new token's KV goes into the next slot.
    pub write: Vec<PageTag>,
}

/// What the device did with a [`Job`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Done {
    DecodeStep {
        job: StepJob,
        outcome: StepOutcome,
    },
    /// What became of the forward's KV write.
    Forward {
        job: ForwardJob,
        written: Result<(), WriteError>,
    },
}

impl Done {
    /// The job this is the completion of.
    pub fn job(&self) -> Job {
        match self {
            Done::DecodeStep { job, .. } => Job::DecodeStep(job.clone()),
            Done::Forward { job, .. } => Job::Forward(job.clone()),
        }
    }
}

/// What one decode step did on the device.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum StepOutcome {
    /// The tag check did not pass: nothing was read or written.
    TagsFailed(TagError),
    /// Attention failed on the device: nothing was written.
    AttendFailed(DeviceError),
    /// Attention produced `token`; `write` is what became of its KV.
    Attended {
        token: Token,
        write: Result<(), WriteError>,
    },
}

impl Job {
    /// The room the job serves.
    pub fn room(&self) -> RoomKey {
        match self {
            Job::DecodeStep(s) => s.room,
            Job::Forward(f) => f.room,
        }
    }

    /// What a device that failed before it started the job did: nothing, and the
    /// request it serves fails ([`crate::msg::Why::DeviceFailed`]).
    pub fn failed(self, e: DeviceError) -> Done {
        match self {
            Job::DecodeStep(job) => Done::DecodeStep {
                job,
                outcome: StepOutcome::TagsFailed(TagError::Device(e)),
            },
            Job::Forward(job) => Done::Forward {
                job,
                written: Err(WriteError::Device(e)),
            },
        }
    }

    /// Carry the job out on `gpu`. The one statement of what a job does on a device,
    /// for every driver.
    pub fn run<G: Gpu>(self, gpu: &mut G) -> Done {
        match self {
            Job::DecodeStep(job) => {
                let outcome = step(&job, gpu);
                Done::DecodeStep { job, outcome }
            }
            Job::Forward(job) => {
                let written = gpu.write_tokens(&job.pages, 0, &job.prompt, job.room);
                Done::Forward { job, written }
            }
        }
    }
}

/// One decode step on the device, in the order the scheduler does it.
fn step<G: Gpu>(job: &StepJob, gpu: &mut G) -> StepOutcome {
    assert!(job.pages.len() <= job.write.len(), "{job:?}");
    if job.check_tags {
        if let Err(e) = gpu.check_tags(&job.pages, job.room) {
            return StepOutcome::TagsFailed(e);
        }
    }
    let token = match gpu.attend(&ids(&job.pages), job.seq_len, job.query_pos) {
        Ok(t) => t,
        Err(e) => return StepOutcome::AttendFailed(e),
    };
    let write = gpu.write_tokens(&job.write, job.seq_len, &[token], job.room);
    StepOutcome::Attended { token, write }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::SymbolicGpu;
    use crate::ids::{Generation, PageId};

    fn step_outcome(done: Done) -> StepOutcome {
        match done {
            Done::DecodeStep { outcome, .. } => outcome,
            other => panic!("a step's job answers as a step: {other:?}"),
        }
    }

    #[test]
    fn a_step_checks_attends_and_writes_in_order() {
        let room = RoomKey::new(1, 1);
        let tag = PageTag {
            page: PageId(1),
            gen: Generation(1),
        };
        let job = StepJob {
            room,
            step: 0,
            seq_len: 0,
            query_pos: 0,
            pages: vec![tag],
            check_tags: true,
            write: vec![tag],
        };
        let mut gpu = SymbolicGpu::new(2, 4);
        // Page 1 was never written for this room: the check refuses before any read.
        let outcome = step_outcome(Job::DecodeStep(job.clone()).run(&mut gpu));
        assert!(
            matches!(outcome, StepOutcome::TagsFailed(TagError::Mismatch(_))),
            "{outcome:?}"
        );
        let unchecked = StepJob {
            check_tags: false,
            ..job
        };
        let outcome = step_outcome(Job::DecodeStep(unchecked).run(&mut gpu));
        assert!(
            matches!(outcome, StepOutcome::Attended { write: Ok(()), .. }),
            "{outcome:?}"
        );
        // A forward writes the prompt at positions 0.. of its pages.
        let forward = Job::Forward(ForwardJob {
            room,
            pages: vec![tag],
            prompt: vec![7, 8],
        });
        assert!(matches!(
            forward.clone().run(&mut gpu),
            Done::Forward {
                written: Ok(()),
                ..
            }
        ));
        assert_eq!(gpu.token_at(&[PageId(1)], 1), Ok(8));
        let failed = forward.failed(DeviceError {
            op: "test",
            detail: "gone".into(),
        });
        assert!(matches!(
            failed,
            Done::Forward {
                written: Err(WriteError::Device(_)),
                ..
            }
        ));
    }
}
