//! Writing a run's HTML timeline (`--html FILE` of `replay`, `check` and `audit`): the
//! page itself is `kvsim_oracle::timeline`'s; this only writes it and says where.

use anyhow::{Context, Result};
use kvsim_oracle::timeline::{render, Timeline};
use std::path::Path;

/// Render `t` and write it to `path`; returns the line the command prints.
pub fn write(path: &Path, t: &Timeline) -> Result<String> {
    let html = render(t);
    std::fs::write(path, &html)
        .with_context(|| format!("cannot write the HTML timeline to {}", path.display()))?;
    Ok(format!(
        "timeline: {} entries drawn, {} bytes written to {}",
        t.entries.len().min(t.max_entries),
        html.len(),
        path.display()
    ))
}
