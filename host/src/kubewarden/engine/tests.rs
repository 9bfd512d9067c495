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

#[test]
fn more_instances_than_the_pool_holds_at_once_are_refused_not_crashed() {
    let limits = Limits {
        instances: 2,
        memory_bytes: 4 << 20,
    };
    let e = Arc::new(engine("(loop $l (br $l)) (i32.const 0)", limits));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let e = e.clone();
            std::thread::spawn(move || e.call("validate", b"{}", Arc::new(Counting::default())))
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let refused = results
        .iter()
        .filter(|r| matches!(r, Err(EngineError::Instantiate(_))))
        .count();
    assert!(refused >= 1, "two slots, four calls at once: {results:?}");
    // Afterwards the pool is whole again: a call gets an instance (and
    // runs to its deadline).
    let again = e.call("validate", b"{}", Arc::new(Counting::default())).unwrap_err();
    assert!(matches!(again, EngineError::Deadline { .. }), "{again}");
}
