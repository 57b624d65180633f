//! Is there a CUDA driver and a device? Answered without panicking.
//!
//! cudarc panics the first time it touches a missing `libcuda`, so this probe asks
//! `is_culib_present()` first and only then counts devices, inside `catch_unwind`. It
//! does not create a context (that is [`crate::cuda::CudaDevice::open`]). Invariant:
//! [`cuda_device`] returns on every machine; the CPU CI machine gets
//! [`Probe::Absent`].

use std::panic::{catch_unwind, AssertUnwindSafe};

/// What the probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// A driver with at least one device.
    Present { devices: i32 },
    /// No usable device, and why.
    Absent(String),
}

/// Probe for a CUDA driver and device.
pub fn cuda_device() -> Probe {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library by name.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Probe::Absent("the CUDA driver library (libcuda) is not present".into());
    }
    match catch_unwind(AssertUnwindSafe(cudarc::driver::CudaContext::device_count)) {
        Ok(Ok(n)) if n > 0 => Probe::Present { devices: n },
        Ok(Ok(_)) => Probe::Absent("the CUDA driver reports no device".into()),
        Ok(Err(e)) => Probe::Absent(format!("the CUDA driver reports {e}")),
        Err(_) => Probe::Absent("the CUDA driver panicked while counting devices".into()),
    }
}
