//! The `Gpu` seam: one node's KV memory and the compute over it.
//!
//! Backends: [`SymbolicGpu`] (tiny and hashable, for the model checker and the
//! simulator) and [`HostGpu`] (real f32 arithmetic on the CPU). Nodes write KV through
//! [`write_traced`], which states every write as a [`TraceEvent::KvWritten`] event:
//! that is how oracles know who wrote which slot, without reading any backend. All of them
//! implement the same toy model, "echo attention", and must produce the same tokens
//! for the same inputs (a cross-backend test checks it):
//!
//! - Position `i` of a sequence lives in page `pages[i / page_size]` at slot
//!   `i % page_size`. A slot holds a key and a value.
//! - The key written at slot `o` is row `o` of a Sylvester-Hadamard matrix of width
//!   `d = page_size.next_power_of_two()`: keys within a page are orthogonal.
//! - The value encodes the token, one ±0/1 lane per bit (32 lanes).
//! - Decode step `s` of `n` queries position `q(s)`, spread evenly over the prompt,
//!   attending over the slots of the page that holds `q(s)`: softmax of `K·q/sqrt(d)`,
//!   then the weighted sum of values. When one slot takes more than half the weight and
//!   its score is positive, each value lane above 0.5 is a 1-bit of the reply token;
//!   otherwise the step emits token 0. So the reply echoes the token stored at `q(s)`,
//!   whoever wrote it: a page that still holds another tenant's KV is echoed back,
//!   exactly as an operator's canary check would see it.
//!
//! Pages are never zeroed unless the node asks (defense 7), as in SGLang.
//!
//! [`TraceEvent::KvWritten`]: crate::trace::TraceEvent::KvWritten

pub mod bytes;
mod echo;
mod errors;
mod host;
pub mod layout;
pub mod memory;
mod seam;
mod symbolic;
mod traced;

pub use bytes::{ByteWrite, LandBytesError, WireWords};
pub use echo::{
    digest_tokens, hadamard, key_width, query_position, splitmix64, TokenDigest, VALUE_LANES,
};
pub use errors::{DeviceError, TagError, TagMismatch, WriteError, WriteRefused, WriteTag};
pub use host::HostGpu;
pub use memory::{HostMemory, Region};
pub use seam::{ids, AttendRequest, Gpu, KvPayload};
pub use symbolic::{SymbolicGpu, SymbolicPage};
pub use traced::{device_fault, trace_write, write_traced, zero_on_free, zero_pages};
