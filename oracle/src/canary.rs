//! Canary prompts: every prompt token names the request it belongs to.
//!
//! Token `i` of request `r`'s prompt is `((r + 1) << 16) | (i & 0xFFFF)`, so any token
//! a reply echoes says whose prompt it came from: the black-box check an operator's
//! canary load makes (a reply carrying another request's marker is a leak). Token 0 is
//! the placeholder of a legacy rejection and names nobody. At most [`MAX_REQUESTS`]
//! requests fit the scheme.

use kvsim_engine::ids::{RequestId, Token};

/// The most requests one run may hold: the request number takes 16 bits.
pub const MAX_REQUESTS: usize = 0xFFFF;

/// The canary id of a request (never 0).
pub fn id(req: RequestId) -> u32 {
    (req.0 as u32).wrapping_add(1)
}

/// The canary prompt of `req`, `len` tokens long.
pub fn prompt(req: RequestId, len: u64) -> Vec<Token> {
    (0..len).map(|i| prompt_token(req, i)).collect()
}

/// Token `pos` of the canary prompt of `req`.
pub fn prompt_token(req: RequestId, pos: u64) -> Token {
    (id(req) << 16) | (pos as u32 & 0xFFFF)
}

/// Which request's prompt a token came from (`None` for placeholder tokens).
pub fn owner(token: Token) -> Option<RequestId> {
    let c = token >> 16;
    (c != 0).then(|| RequestId(u64::from(c) - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canary_tokens_name_their_request() {
        for t in prompt(RequestId(41), 5) {
            assert_eq!(owner(t), Some(RequestId(41)));
        }
        assert_eq!(owner(0), None);
    }
}
