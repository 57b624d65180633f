//! The front's limits: the sizes and times a request must keep to, the prompt tokens
//! it may carry, the connections served at once ([`FrontLimits`]). Not where they are
//! enforced (`conn`, `body`, the front's tokenizer).

use std::time::Duration;

/// Most bytes of a request line plus headers.
pub const MAX_HEAD: usize = 16 * 1024;
/// Most bytes of a request body (the write-ups' 700,000-word prompt is 1.4 MB).
pub const MAX_BODY: usize = 16 * 1024 * 1024;
/// Most time to receive a request's head, and then its body.
pub const READ_DEADLINE: Duration = Duration::from_secs(10);
/// Most prompt tokens the front accepts (beyond it 400, whatever the context).
pub const MAX_PROMPT_TOKENS: usize = 1 << 22;
/// Most connections served at once (beyond it 503).
pub const MAX_CONNECTIONS: usize = 1024;

/// The front's limits (tests lower them; `kvsim serve` uses the defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrontLimits {
    pub max_connections: usize,
    pub read_deadline: Duration,
}

impl Default for FrontLimits {
    fn default() -> Self {
        FrontLimits {
            max_connections: MAX_CONNECTIONS,
            read_deadline: READ_DEADLINE,
        }
    }
}
