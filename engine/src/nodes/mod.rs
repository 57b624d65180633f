//! The engine's nodes: the [`router::Router`], the [`prefill::PrefillNode`] and the
//! [`decode::DecodeNode`], the [`node::Node`] enum that puts the three behind one
//! interface for drivers, worker mode's [`worker::WorkerFront`] (SGLang's worker
//! front before a prefill or decode node, when the real router drives them), and the
//! [`retired::RetiredRooms`] each node keeps of the room
//! uses it already answered. Each node is a folder: its state in `state.rs`, its
//! transitions in one file per concern. Declarations only; the crate root re-exports
//! these modules at their old paths (`kvsim_engine::prefill`, ...). Not the KV memory
//! (`kv`), the device (`gpu`) nor the driver (`world`).

pub mod decode;
pub mod node;
pub mod prefill;
pub mod prefill_vllm;
pub mod retired;
pub mod role;
pub mod router;
pub mod worker;
