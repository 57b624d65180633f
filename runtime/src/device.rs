//! A node's device thread: it runs the node's compute ([`Job`]) on the node's memory,
//! off the node's loop.
//!
//! The loop hands it one job and waits for what the device did before it takes its
//! next input, so a step is as atomic as in every other driver (the model checker
//! explores no input between a job and its completion, and neither may the runtime:
//! docs/DECISIONS.md, "Compute as an effect"). The transfer thread still lands KV
//! writes into the same memory meanwhile, gated by the node's one ownership record as
//! before.

use crate::gpu::SharedGpu;
use crate::sync::mpsc::{channel, Receiver, Sender};
use crate::sync::thread;
use kvsim_engine::compute::{Done, Job};
use kvsim_engine::gpu::{DeviceError, Gpu};

/// The loop's end of a device thread. Dropping it ends the thread.
#[derive(Debug)]
pub struct DeviceThread {
    jobs: Sender<Job>,
    done: Receiver<Done>,
}

impl DeviceThread {
    /// Start the device thread of node `name` over `gpu` (a handle on the node's own
    /// memory).
    pub fn spawn<G>(name: String, mut gpu: SharedGpu<G>) -> std::io::Result<Self>
    where
        G: Gpu + Send + 'static,
    {
        let (jobs, job_rx) = channel::<Job>();
        let (done_tx, done) = channel::<Done>();
        thread::Builder::new().name(name).spawn(move || {
            for job in job_rx {
                if done_tx.send(job.run(&mut gpu)).is_err() {
                    return;
                }
            }
        })?;
        Ok(DeviceThread { jobs, done })
    }

    /// Run `job` on the device thread and wait for what it did. A device thread that is
    /// gone (it panicked) fails the job as a device failure before anything ran: the
    /// request fails, the process goes on.
    pub fn run(&self, job: Job) -> Done {
        let lost = |job: Job| {
            job.failed(DeviceError {
                op: "device thread",
                detail: "the node's device thread is gone".into(),
            })
        };
        let asked = job.clone();
        if let Err(e) = self.jobs.send(job) {
            return lost(e.0);
        }
        let done = self.done.recv().unwrap_or_else(|_| lost(asked.clone()));
        debug_assert_eq!(done.job(), asked, "the device answers the job it was given");
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvsim_engine::compute::{Done, Job, StepJob, StepOutcome};
    use kvsim_engine::gpu::SymbolicGpu;
    use kvsim_engine::ids::{Generation, PageId, PageTag, RoomKey};

    fn job() -> Job {
        let tag = PageTag {
            page: PageId(1),
            gen: Generation(1),
        };
        Job::DecodeStep(StepJob {
            room: RoomKey::new(1, 1),
            step: 0,
            seq_len: 0,
            query_pos: 0,
            pages: vec![tag],
            check_tags: false,
            write: vec![tag],
        })
    }

    /// The device thread does what the job does in place, on the same memory, and a
    /// thread that is gone fails the job as a device failure.
    #[test]
    fn a_job_on_the_device_thread_is_the_job_in_place() {
        let gpu = SharedGpu::new(SymbolicGpu::new(2, 4));
        let device = DeviceThread::spawn("device-test".into(), gpu.clone()).unwrap();
        let mut twin = SymbolicGpu::new(2, 4);
        assert_eq!(device.run(job()), job().run(&mut twin));
        let Done::DecodeStep {
            outcome: StepOutcome::Attended { token, .. },
            ..
        } = device.run(job())
        else {
            panic!("the step attends");
        };
        assert_eq!(
            gpu.token_at(&[PageId(1)], 0),
            Ok(token),
            "the device thread wrote into the node's own memory"
        );
        let (jobs, _) = channel::<Job>();
        let (_, done) = channel::<Done>();
        drop(device);
        let gone = DeviceThread { jobs, done };
        match gone.run(job()) {
            Done::DecodeStep {
                outcome: StepOutcome::TagsFailed(e),
                ..
            } => assert!(e.to_string().contains("device thread"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
