//! `kvsim check --explore` serves stateright's Explorer for the chosen model: its
//! status names the model (not a Rust type path), and its states read as rooms,
//! pages, messages and timers (not a `Debug` dump of the state's structs).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod cli;

/// Stops the Explorer when the test ends, passed or not.
struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// GET `path` from the Explorer; the body of the answer.
fn get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let body = text.split_once("\r\n\r\n")?.1;
    Some(body.to_string())
}

fn get_json(port: u16, path: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = get(port, path).and_then(|b| serde_json::from_str(&b).ok()) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "the Explorer never answered {path}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_explorer_names_the_model_and_shows_readable_states() {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let addr = format!("127.0.0.1:{port}");
    let _serving = Serving(
        Command::new(env!("CARGO_BIN_EXE_kvsim"))
            .current_dir(cli::root())
            .args(["check", "--model", "handoff-small", "--explore", &addr])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("kvsim starts"),
    );
    let status = get_json(port, "/.status");
    assert_eq!(status["model"], "handoff-small", "{status}");

    let init = get_json(port, "/.states/");
    let first = &init.as_array().expect("a list of initial states")[0];
    let state = first["state"].as_str().expect("a state text");
    for want in [
        "model handoff-small",
        "clients:",
        "rooms:",
        "prefill n1:",
        "decode n2:",
        "in flight (",
        "timers: ",
    ] {
        assert!(state.contains(want), "missing `{want}`: {state}");
    }
    for raw in ["State {", "Shared(", "SmallVec", "Inner {", "RoomKey {"] {
        assert!(!state.contains(raw), "a Debug dump (`{raw}`): {state}");
    }
    // One step further: the successors of the first initial state read the same way.
    let next = get_json(port, "/.states/0");
    let states: Vec<&str> = next
        .as_array()
        .expect("successors")
        .iter()
        .filter_map(|v| v["state"].as_str())
        .collect();
    assert!(!states.is_empty(), "{next}");
    assert!(
        states
            .iter()
            .all(|s| s.starts_with("model handoff-small\n") && !s.contains("State {")),
        "{states:?}"
    );
    assert!(
        states.iter().any(|s| s.contains("submitted req")),
        "no successor shows a submitted request: {states:?}"
    );
    // Timers and rooms in the trace's notation, in every successor.
    assert!(
        states
            .iter()
            .all(|s| !s.contains("RoomKey {") && !s.contains("Generation(")),
        "{states:?}"
    );
}
