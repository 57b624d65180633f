//! The checks of the CUDA backend that need no GPU, run by `cargo test` everywhere:
//! the probe, the kernel source against the Rust layout, the NVRTC compilation of every
//! kernel and the committed PTX, and property tests of the one kernel logic (HostGpu,
//! which runs `gpu::layout`, against SymbolicGpu and against a naive tag check).
//!
//! Tests that need NVRTC install its pinned wheel on first use and print `SKIPPED: ...`
//! where it cannot be had, unless `KVSIM_REQUIRE_NVRTC=1` (set by `cargo xtask test`),
//! where they fail instead. No test here
//! touches a device. Every assertion can fail: each compares against an independent
//! definition or a committed artifact.

use kvsim_cuda::cuda::CudaDevice;
use kvsim_cuda::probe::{cuda_device, Probe};
use kvsim_cuda::{kernels, nvrtc, GpuError};
use kvsim_engine::gpu::layout::{self, TAG_WORDS};
use kvsim_engine::gpu::{Gpu, HostGpu, SymbolicGpu, TagError, VALUE_LANES};
use kvsim_engine::ids::{Generation, PageId, PageTag, RoomKey};
use kvsim_gpu_tests::compare::{compare, Workload};
use proptest::prelude::*;

/// `Some(reason)` when NVRTC is absent and that is allowed here (the test then skips,
/// recorded for the run's closing list). The pinned wheel is installed on first use
/// (kvsim-testenv); a failure under `KVSIM_REQUIRE_NVRTC=1` fails the test.
fn nvrtc_skip(test: &str) -> Option<String> {
    let dir = kvsim_testenv::nvrtc_dir(test)?;
    match nvrtc::ensure_in(Some(&dir)) {
        Ok(_) => None,
        Err(why) => {
            kvsim_testenv::skip(
                test,
                kvsim_testenv::Need::Nvrtc,
                &format!("no NVRTC ({why})"),
            );
            Some(why)
        }
    }
}

#[test]
fn probe_answers_without_panicking() {
    let p = cuda_device();
    println!("probe: {p:?}");
    // SAFETY: only tries to dlopen the driver library.
    let lib = unsafe { cudarc::driver::sys::is_culib_present() };
    if !lib {
        assert!(matches!(p, Probe::Absent(_)), "no libcuda, yet {p:?}");
    }
    if std::env::var("KVSIM_EXPECT_NO_GPU").as_deref() == Ok("1") {
        assert!(matches!(p, Probe::Absent(_)), "expected no GPU, got {p:?}");
    }
    // Opening a device where the probe says absent is an error, not a panic.
    if let Probe::Absent(_) = p {
        assert!(matches!(CudaDevice::open(0), Err(GpuError::NoDevice(_))));
    }
}

#[test]
fn cu_defines_equal_the_rust_layout() {
    let d = kernels::defines(kernels::SOURCE);
    let int = |name: &str| -> u64 {
        let v = d
            .get(name)
            .unwrap_or_else(|| panic!("kv.cu lacks #define {name}"));
        let v = v.trim_end_matches(['u', 'U', 'l', 'L']);
        match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => v.parse(),
        }
        .unwrap_or_else(|e| panic!("{name} = {v}: {e}"))
    };
    let float = |name: &str| -> f32 {
        let v = d
            .get(name)
            .unwrap_or_else(|| panic!("kv.cu lacks #define {name}"));
        v.trim_end_matches('f')
            .parse()
            .unwrap_or_else(|e| panic!("{name} = {v}: {e}"))
    };
    assert_eq!(int("KV_VALUE_LANES"), VALUE_LANES as u64);
    assert_eq!(int("KV_TAG_WORDS"), TAG_WORDS as u64);
    assert_eq!(int("KV_TAG_PRESENT"), layout::TAG_PRESENT);
    assert_eq!(int("KV_FLAG_OK"), u64::from(layout::FLAG_OK));
    assert_eq!(int("KV_NO_MISMATCH"), u64::from(layout::NO_MISMATCH));
    assert_eq!(int("KV_ATTEND_THREADS"), u64::from(layout::ATTEND_THREADS));
    let floats = [
        ("KV_EXP_MIN", layout::EXP_MIN),
        ("KV_EXP_LOG2E", layout::EXP_LOG2E),
        ("KV_EXP_LN2_HI", layout::EXP_LN2_HI),
        ("KV_EXP_LN2_LO", layout::EXP_LN2_LO),
        ("KV_EXP_C2", layout::EXP_C2),
        ("KV_EXP_C3", layout::EXP_C3),
        ("KV_EXP_C4", layout::EXP_C4),
        ("KV_EXP_C5", layout::EXP_C5),
        ("KV_EXP_C6", layout::EXP_C6),
    ];
    for (name, want) in floats {
        assert_eq!(float(name).to_bits(), want.to_bits(), "{name}");
    }
    // Every constant of the kernel file is one of those compared above.
    assert_eq!(
        d.len(),
        6 + floats.len(),
        "unchecked #defines in kv.cu: {d:?}"
    );
}

#[test]
fn committed_ptx_has_every_kernel_and_no_fused_multiply_add() {
    let entries = kernels::ptx_entries(kernels::PTX);
    for k in kernels::KERNELS {
        assert!(entries.iter().any(|e| e == k), "kv.ptx lacks {k}");
    }
    assert_eq!(entries.len(), kernels::KERNELS.len(), "{entries:?}");
    assert!(kernels::PTX.contains(".target sm_90"));
    assert!(!kernels::PTX.contains("fma."), "kv.ptx fuses multiply-adds");
    let lowered = kernels::with_ptx_version(kernels::PTX, kernels::FALLBACK_PTX_VERSION);
    assert!(lowered.contains(".version 7.8\n"));
}

#[test]
fn nvrtc_compiles_every_kernel_without_warnings() {
    if nvrtc_skip("nvrtc_compiles_every_kernel_without_warnings").is_some() {
        return;
    }
    let c = match nvrtc::compile(kernels::SOURCE, kernels::PROGRAM) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    assert!(c.log.is_empty(), "NVRTC warnings:\n{}", c.log);
    let entries = kernels::ptx_entries(&c.ptx);
    for k in kernels::KERNELS {
        assert!(
            entries.iter().any(|e| e == k),
            "no kernel {k} in {entries:?}"
        );
    }
    assert!(!c.ptx.contains("fma."), "--fmad=false did not hold");
    // A broken source really fails (the check can fail).
    let broken = kernels::SOURCE.replace(
        "kv_slot_floats(u32 key_width) {",
        "kv_slot_floats(u32 key_width) { undeclared_name;",
    );
    assert!(nvrtc::compile(&broken, kernels::PROGRAM).is_err());
}

#[test]
fn kernels_assemble_to_sm90_machine_code() {
    if nvrtc_skip("kernels_assemble_to_sm90_machine_code").is_some() {
        return;
    }
    let (log, size) = match nvrtc::assemble_sm90(kernels::SOURCE, kernels::PROGRAM) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    };
    println!("{log}");
    assert!(size > 0, "empty CUBIN");
    assert!(
        !log.to_lowercase().contains("warning"),
        "ptxas warnings:\n{log}"
    );
    // ptxas reports every kernel: none was dropped or failed to assemble.
    for k in kernels::KERNELS {
        assert!(log.contains(k), "ptxas did not report {k}:\n{log}");
    }
    // No kernel spills registers to local memory.
    assert!(
        log.lines()
            .filter(|l| l.contains("spill stores"))
            .all(|l| l.contains(" 0 bytes spill stores")),
        "register spills:\n{log}"
    );
}

#[test]
fn committed_ptx_is_current() {
    if nvrtc_skip("committed_ptx_is_current").is_some() {
        return;
    }
    let c = match nvrtc::compile(kernels::SOURCE, kernels::PROGRAM) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    assert!(
        c.ptx.trim_end() == kernels::PTX.trim_end(),
        "cuda/kernels/kv.ptx is stale: cargo run -p kvsim-cuda --bin gen-ptx"
    );
}

/// A fixed workload where HostGpu, SymbolicGpu and the shared check agree.
#[test]
fn host_and_symbolic_agree_on_fixed_seeds() {
    for seed in 0..40 {
        let w = Workload::from_seed(seed, 120);
        let mut host = HostGpu::new(w.pool_pages, w.page_size);
        let mut sym = SymbolicGpu::new(w.pool_pages, w.page_size);
        if let Err(e) = compare(&mut host, &mut sym, &w, |_, _| true) {
            panic!("{e}");
        }
    }
}

/// The naive definition the kernel's parallel `atomicMin` search must equal.
fn naive_first_mismatch(host: &HostGpu, table: &[PageTag], room: RoomKey) -> u32 {
    for (i, t) in table.iter().enumerate() {
        let want = kvsim_engine::gpu::WriteTag { room, gen: t.gen };
        if host.page_tag(t.page).unwrap() != Some(want) {
            return i as u32 + 1;
        }
    }
    layout::FLAG_OK
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random workloads (page reuse under new generations, stale slots and tags,
    /// transfers, zeroing): HostGpu (running `gpu::layout`) equals SymbolicGpu.
    #[test]
    fn host_equals_symbolic(seed in any::<u64>(), ops in 1u32..150) {
        let w = Workload::from_seed(seed, ops);
        let mut host = HostGpu::new(w.pool_pages, w.page_size);
        let mut sym = SymbolicGpu::new(w.pool_pages, w.page_size);
        let r = compare(&mut host, &mut sym, &w, |_, _| true);
        prop_assert!(r.is_ok(), "{:?}", r);
    }

    /// `validate_tags` over stored words equals the naive first mismatch, and its
    /// flag turns into the trait's `TagMismatch` for that entry, after random writes
    /// and reallocations.
    #[test]
    fn validate_tags_is_the_first_mismatch(
        writes in prop::collection::vec((1u32..10, 1u64..4, 1u32..4, 1u64..3), 0..20),
        table in prop::collection::vec((0u32..12, 1u64..4), 0..8),
        room in (1u32..4, 1u64..3),
    ) {
        let mut host = HostGpu::new(10, 2);
        for (page, gen, r, rg) in writes {
            let t = PageTag { page: PageId(page), gen: Generation(gen) };
            prop_assert!(host.write_tokens(&[t], 0, &[7], RoomKey::new(r, rg)).is_ok());
        }
        let table: Vec<PageTag> = table
            .into_iter()
            .map(|(p, g)| PageTag { page: PageId(p), gen: Generation(g) })
            .collect();
        let room = RoomKey::new(room.0, room.1);
        let flag = layout::validate_tags(host.tag_words(), 10, &table, room);
        prop_assert_eq!(flag, naive_first_mismatch(&host, &table, room));
        let sym_like = (0..table.len()).find(|&i| {
            host.page_tag(table[i].page).unwrap() != Some(kvsim_engine::gpu::WriteTag { room, gen: table[i].gen })
        });
        match host.check_tags(&table, room) {
            Ok(()) => prop_assert_eq!(sym_like, None),
            Err(TagError::Mismatch(m)) => {
                prop_assert_eq!(Some(m.expected), sym_like.map(|i| table[i]));
                prop_assert_eq!(m.found, host.page_tag(m.expected.page).unwrap());
            }
            Err(TagError::Device(e)) => panic!("a host KV memory never fails: {e}"),
        }
    }
}

/// The incident check names where two backends part: a backend whose memory reads
/// back zeros (every page as if never written) against HostGpu's reference runs
/// differs, and the error shows the first differing trace entry and the replies.
#[test]
fn incident_difference_names_the_first_differing_entry() {
    use kvsim_gpu_tests::device_run::incident_on;
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/glm53-incident.toml");
    let (_, host) = incident_on("HostGpu", &path, HostGpu::new, None).expect("host runs");
    let reference: [_; 2] = host.try_into().expect("two runs");
    let err = incident_on("SymbolicGpu", &path, SymbolicGpu::new, Some(&reference))
        .expect_err("a symbolic backend's trace is not HostGpu's");
    let text = err.to_string();
    assert!(
        text.contains("differs from the reference backend"),
        "{text}"
    );
    assert!(text.contains("agree on the first"), "{text}");
    assert!(text.contains("reply "), "{text}");
}
