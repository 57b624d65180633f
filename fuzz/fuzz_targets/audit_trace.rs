//! Fuzz what `kvsim audit` reads: any bytes, as a trace (header line, then entries),
//! give an error naming a line or a report, with no panic (overflow included) and no
//! allocation over the bound of `bounded_alloc`. The oracle judges whatever parses, so
//! a hostile trace exercises every invariant's code on nonsense.
#![no_main]

#[path = "bounded_alloc.rs"]
mod bounded_alloc;

#[global_allocator]
static ALLOC: bounded_alloc::Bounded = bounded_alloc::Bounded;

use kvsim_oracle::audit::{audit_readers, render};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let input: Box<dyn std::io::Read> = Box::new(std::io::Cursor::new(data.to_vec()));
    if let Ok(report) = audit_readers(vec![("fuzz".into(), input)]) {
        let _ = render(&report);
        // The entries read never exceed the lines given.
        assert!(report.entries as usize <= data.iter().filter(|b| **b == b'\n').count() + 1);
    }
});
