//! A global allocator for the fuzz targets that aborts on any single allocation
//! larger than [`LIMIT`]: parsing a small input must never ask for gigabytes (the
//! class of `max_rooms = 4294967295` or a 10^18-seed range). libFuzzer reports the
//! abort as a crash with the input that caused it.

use std::alloc::{GlobalAlloc, Layout, System};

/// The largest single allocation any input may cause.
pub const LIMIT: usize = 256 << 20;

pub struct Bounded;

unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > LIMIT {
            eprintln!("allocation of {} bytes exceeds the fuzz bound of {LIMIT}", layout.size());
            std::process::abort();
        }
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > LIMIT {
            eprintln!("allocation of {} bytes exceeds the fuzz bound of {LIMIT}", layout.size());
            std::process::abort();
        }
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > LIMIT {
            eprintln!("reallocation to {new_size} bytes exceeds the fuzz bound of {LIMIT}");
            std::process::abort();
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
