//! The engine against guests that break the rules: bad pointers, runaway
//! memory and loops, oversized calls. Each ends that call with its own
//! error; the host carries on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use config_snapshot_policy::host::host_error::{Code, HostError};

use super::wapc::MAX_PAYLOAD;
use super::*;

/// Counts the host calls that reached it, and answers each with `ok`.
#[derive(Default)]
struct Counting(AtomicUsize);

impl CallHandler for Counting {
    fn call(&self, _: &str, _: &str, _: &str, _: &[u8]) -> Result<Vec<u8>, CallFailure> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(b"ok".to_vec())
    }
}

const IMPORTS: &str = r#"
  (import "wapc" "__host_call" (func $host_call (param i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "wapc" "__host_error_len" (func $host_error_len (result i32)))
  (import "wapc" "__host_error" (func $host_error (param i32)))
  (import "wapc" "__guest_response" (func $guest_response (param i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "config-snapshotv1now")
  (func (export "wapc_init"))
"#;

fn engine(body: &str, limits: Limits) -> Engine {
    let wat = format!("(module {IMPORTS} (func (export \"__guest_call\") (param i32 i32) (result i32) {body}))");
    Engine::compile(wat.as_bytes(), Duration::from_millis(500), limits).unwrap()
}

/// A host call of `config-snapshot`/`v1`/`now` whose payload is at
/// `ptr`, `len` bytes.
fn call_with_payload(ptr: i64, len: i64) -> String {
    format!(
        "(call $host_call (i32.const 0) (i32.const 15) (i32.const 15) (i32.const 2) (i32.const 17) (i32.const 3) (i32.const {ptr}) (i32.const {len}))"
    )
}

#[test]
fn a_pointer_outside_the_guest_memory_is_its_error_not_a_host_panic() {
    let handler = Arc::new(Counting::default());
    for (ptr, len) in [(65_000, 1_000), (-8, 4), (4, -1), (i32::MAX as i64, 2)] {
        let e = engine(
            &format!("(drop {}) (i32.const 1)", call_with_payload(ptr, len)),
            Limits::default(),
        );
        let err = e.call("validate", b"{}", handler.clone()).unwrap_err();
        assert!(
            matches!(&err, EngineError::Guest { message, .. } if message.contains("outside its memory")),
            "{ptr}+{len}: {err}"
        );
    }
    assert_eq!(
        handler.0.load(Ordering::SeqCst),
        0,
        "no call with a bad payload reached the handler"
    );
    // The control: a payload inside the memory is answered.
    let e = engine(
        &format!("(drop {}) (i32.const 1)", call_with_payload(0, 4)),
        Limits::default(),
    );
    let _ = e.call("validate", b"{}", handler.clone());
    assert_eq!(handler.0.load(Ordering::SeqCst), 1);
}

#[test]
fn an_oversized_host_call_is_answered_too_large_without_reaching_the_host() {
    let handler = Arc::new(Counting::default());
    // The guest asks with a payload over the limit, then hands back the
    // host's error as its response.
    let body = format!(
        "(drop {}) (call $host_error (i32.const 1024)) (call $guest_response (i32.const 1024) (call $host_error_len)) (i32.const 1)",
        call_with_payload(0, (MAX_PAYLOAD + 1) as i64)
    );
    let answer = engine(&body, Limits::default())
        .call("validate", b"{}", handler.clone())
        .unwrap();
    let error = HostError::from_bytes(&answer).expect("our error protocol");
    assert_eq!(error.code, Code::TooLarge, "{error}");
    assert_eq!(handler.0.load(Ordering::SeqCst), 0);
}

#[test]
fn memory_past_the_instance_limit_stops_that_call() {
    let limits = Limits {
        instances: 2,
        memory_bytes: 2 << 20,
    };
    // 64 pages of 64 KiB: 4 MiB more than the 1 page the guest has.
    let e = engine("(drop (memory.grow (i32.const 64))) (i32.const 1)", limits);
    let err = e.call("validate", b"{}", Arc::new(Counting::default())).unwrap_err();
    assert!(
        matches!(err, EngineError::Memory { limit, .. } if limit == 2 << 20),
        "{err}"
    );
    // Within the limit, the same growth is fine.
    let e = engine("(drop (memory.grow (i32.const 16))) (i32.const 1)", limits);
    let err = e.call("validate", b"{}", Arc::new(Counting::default())).unwrap_err();
    assert!(
        matches!(err, EngineError::Guest { .. }),
        "no response, but no limit: {err}"
    );
}

#[test]
fn a_runaway_guest_is_stopped_at_its_deadline_and_said_so_by_type() {
    let e = engine("(loop $l (br $l)) (i32.const 0)", Limits::default());
    let started = std::time::Instant::now();
    let err = e.call("validate", b"{}", Arc::new(Counting::default())).unwrap_err();
    assert!(matches!(err, EngineError::Deadline { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// The finding "the wasm pool is overcommitted": more calls at once than
/// the pool has instances, of both lanes, each wait for one; none is
/// refused. Before the engine counted its instances, a call past the pool
/// failed with `Instantiate` (and serve answered the API server a 500).
#[test]
fn more_calls_than_the_pool_holds_wait_for_an_instance_none_is_refused() {
    let limits = Limits {
        instances: 2,
        memory_bytes: 4 << 20,
    };
    let e = Arc::new(engine("(loop $l (br $l)) (i32.const 0)", limits));
    let threads: Vec<_> = [Lane::Shared, Lane::Shared, Lane::Shared, Lane::Kept, Lane::Kept]
        .into_iter()
        .map(|lane| {
            let e = e.clone();
            std::thread::spawn(move || e.call_in(lane, "validate", b"{}", Arc::new(Counting::default())))
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        results.iter().all(|r| matches!(r, Err(EngineError::Deadline { .. }))),
        "two instances, five calls at once: each got one and ran to its deadline: {results:?}"
    );
    assert_eq!((e.instances.held(Lane::Shared), e.instances.held(Lane::Kept)), (0, 0));
}

/// Answers `ok` once told to, and says when it was called.
struct Held {
    called: std::sync::mpsc::SyncSender<()>,
    go: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl CallHandler for Held {
    fn call(&self, _: &str, _: &str, _: &str, _: &[u8]) -> Result<Vec<u8>, CallFailure> {
        let _ = self.called.send(());
        let _ = self.go.lock().unwrap().recv();
        Ok(b"ok".to_vec())
    }
}

/// serve's pass keeps its instance: while shared calls hold every shared
/// instance and more wait, a kept call gets the kept one at once, and no
/// shared call takes it.
#[test]
fn a_kept_call_finds_its_instance_while_shared_calls_hold_and_wait() {
    use std::sync::mpsc::{channel, sync_channel};
    let limits = Limits {
        instances: 2,
        memory_bytes: 4 << 20,
    };
    let e = Arc::new(engine(
        &format!("(drop {}) (i32.const 1)", call_with_payload(0, 4)),
        limits,
    ));
    let held = |e: &Arc<Engine>| {
        let (called, entered) = sync_channel(4);
        let (release, go) = channel();
        let handler = Arc::new(Held {
            called,
            go: std::sync::Mutex::new(go),
        });
        let e = e.clone();
        let call = std::thread::spawn(move || e.call("validate", b"{}", handler));
        (entered, release, call)
    };
    let (first_in, release_first, first) = held(&e);
    first_in.recv().unwrap();
    let (second_in, release_second, second) = held(&e);
    std::thread::sleep(Duration::from_millis(100));
    let (sent, kept) = channel();
    let kept_call = {
        let e = e.clone();
        std::thread::spawn(move || {
            let _ = sent.send(e.call_in(Lane::Kept, "validate", b"{}", Arc::new(Counting::default())));
        })
    };
    let answer = kept
        .recv_timeout(Duration::from_secs(20))
        .expect("the kept call got its instance while the shared ones were held");
    assert!(!matches!(answer, Err(EngineError::Instantiate(_))), "{answer:?}");
    assert!(second_in.try_recv().is_err(), "the second shared call still waits");
    release_first.send(()).unwrap();
    // (The guest hands back no response: its own error, not the pool's.)
    let first = first.join().unwrap();
    assert!(!matches!(first, Err(EngineError::Instantiate(_))), "{first:?}");
    second_in.recv().unwrap();
    release_second.send(()).unwrap();
    let second = second.join().unwrap();
    assert!(!matches!(second, Err(EngineError::Instantiate(_))), "{second:?}");
    kept_call.join().unwrap();
}
