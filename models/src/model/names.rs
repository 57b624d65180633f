//! The names of the properties, as the CLI and the tests refer to them.
//!
//! A leaf: the model's properties (`model::properties`) and the specs'
//! `reaches` lists ([`crate::spec::ModelSpec::reaches`]) both name them from here;
//! nothing here decides whether a property holds.

pub const S1: &str = "S1 partition";
pub const S2: &str = "S2 no write after free";
pub const S3: &str = "S3 isolation";
pub const S4: &str = "S4 length agreement";
pub const S5: &str = "S5 rejected means retired";
pub const S6: &str = "S6 one honest answer";
pub const S7: &str = "S7 metadata integrity";
pub const S8: &str = "S8 free discipline";
pub const S9: &str = "S9 release after drain";
pub const S10: &str = "S10 reply correctness";
pub const L5: &str = "L5 nothing larger than the pool admitted";
pub const QUIESCENCE: &str = "L1-L4 no action enabled => every request answered, every pool full";
pub const COMPLETES: &str = "a request completes";
pub const ABORT_RACE: &str = "an abort races an in-flight KV write";
pub const REJECTED: &str = "an over-length request is rejected";
pub const LATE_ACK: &str = "a drain ack arrives after a timeout";
pub const CRASH: &str = "a node crashes while it holds a request";
pub const STOPPED: &str = "a defense stops a hazard";
pub const ALTERED: &str = "a KV write lands altered by a data fault";
pub const REFIRED: &str = "a spent timer is delivered again";
pub const CAUSED: &str = "an error answer has a cause";
pub const RETRIED_LIVE: &str = "a request is retried while a given-up attempt's half is live";
pub const FROZEN_TIMEOUT: &str = "a timeout fires while a node is frozen";
pub const SPREAD: &str = "every decode node holds a request at once";
