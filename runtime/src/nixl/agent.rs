//! Making a NIXL agent with the UCX backend, and the checks before the first call
//! into the library.

use kvsim_engine::gpu::Region;
use nixl_sys::{Agent, AgentConfig, MemType, MemoryRegion, NixlDescriptor};
use std::ffi::CStr;

/// The delay (µs) between the receiver's progress thread's polls: with none it
/// busy-polls a core while idle (measured 0.3 to 0.94 CPU, the NIXL issue); 100 µs
/// cut that to 0.025 CPU. `KVSIM_NIXL_PTHR_DELAY_US` overrides it.
pub const PROGRESS_DELAY_US: u64 = 100;

/// Can `libnixl_capi.so` be loaded? `Err` with the loader's reason: the stub API
/// aborts the process on the first call when it cannot.
pub fn available() -> Result<(), String> {
    let name = c"libnixl_capi.so";
    // SAFETY: dlopen with a valid C string; the handle is closed at once (the stub
    // opens its own).
    let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a C string owned by the loader, or null.
        let why = unsafe { libc::dlerror() };
        let why = match why.is_null() {
            true => "unknown".to_string(),
            false => unsafe { CStr::from_ptr(why) }
                .to_string_lossy()
                .into_owned(),
        };
        return Err(format!(
            "cannot load libnixl_capi.so ({why}): set LD_LIBRARY_PATH to the nixl-cu12 \
             wheel's library folder (.nixl_cu12.mesonpy.libs)"
        ));
    }
    // SAFETY: `h` came from dlopen above.
    unsafe { libc::dlclose(h) };
    Ok(())
}

/// `UCX_TLS=tcp` unless the caller chose: called before any thread starts (UCX reads
/// its environment when the first agent's backend is made).
pub fn prepare_env() {
    if std::env::var_os("UCX_TLS").is_none() {
        // SAFETY (edition 2021: safe): called from `main` before threads exist.
        std::env::set_var("UCX_TLS", "tcp");
    }
}

/// An agent named `name` with a UCX backend: its progress thread on (with
/// [`PROGRESS_DELAY_US`]) for a receiver, whose memory must take writes while the
/// node runs nothing; off for a writer, whose poller drives progress when it asks for
/// its transfers' state.
pub(super) fn make(name: &str, progress_thread: bool) -> Result<Agent, String> {
    available()?;
    let delay = std::env::var("KVSIM_NIXL_PTHR_DELAY_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(PROGRESS_DELAY_US);
    let cfg = AgentConfig {
        enable_prog_thread: progress_thread,
        pthr_delay_us: delay,
        ..AgentConfig::default()
    };
    let err = |what: &str, e: nixl_sys::NixlError| format!("nixl: {what}: {e}");
    let agent = Agent::new_configured(name, &cfg).map_err(|e| err("creating the agent", e))?;
    let (_mems, params) = agent
        .get_plugin_params("UCX")
        .map_err(|e| err("the UCX plugin", e))?;
    agent
        .create_backend("UCX", &params)
        .map_err(|e| err("the UCX backend", e))?;
    Ok(agent)
}

/// A region of host memory as NIXL registers it.
#[derive(Debug)]
pub(super) struct Dram(pub Region);

impl MemoryRegion for Dram {
    unsafe fn as_ptr(&self) -> *const u8 {
        self.0.addr as *const u8
    }
    fn size(&self) -> usize {
        self.0.len as usize
    }
}

impl NixlDescriptor for Dram {
    fn mem_type(&self) -> MemType {
        MemType::Dram
    }
    fn device_id(&self) -> u64 {
        0
    }
}
