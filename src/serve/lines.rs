//! Reading `kvsim serve`'s stdout: the addresses it announces once a listener is
//! bound (client endpoint, HTTP front, worker API). The lines themselves are printed
//! by [`super::start`]; these readers are how tests and tools find them.

use std::net::SocketAddr;

/// Read the worker API's address from a server's stdout line.
pub fn worker_of(line: &str) -> Option<SocketAddr> {
    line.strip_prefix("kvsim serve: worker http on ")?
        .split(' ')
        .next()?
        .trim()
        .parse()
        .ok()
}

/// Read the HTTP front's address from a server's stdout line.
pub fn http_of(line: &str) -> Option<SocketAddr> {
    line.strip_prefix("kvsim serve: http on ")?
        .trim()
        .parse()
        .ok()
}

/// Read the client endpoint's address from a server's stdout line.
pub fn endpoint_of(line: &str) -> Option<SocketAddr> {
    line.strip_prefix("kvsim serve: client endpoint on ")?
        .trim()
        .parse()
        .ok()
}
