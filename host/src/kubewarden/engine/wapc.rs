//! The waPC protocol, host side, on wasmtime directly: the `wapc` imports a
//! guest calls, and one guest call. The protocol is small (the guest asks
//! for its request, answers with a response or an error, and calls the
//! host through `__host_call`, then fetches the host's response or error),
//! and owning it lets the host check every pointer the guest hands it: a
//! bad one is an error of that instance, never a panic of the host, and no
//! payload larger than [`MAX_PAYLOAD`] crosses.

use std::sync::Arc;

use config_snapshot_policy::host::host_error::{Code, HostError};
use wasmtime::{Caller, Extern, Linker, Memory};
use wasmtime_wasi::p1::WasiP1Ctx;

use super::call::{CallFailure, CallHandler};

/// The largest payload, in either direction, of one host call or one
/// guest response: above the API server's 3 MiB objects twice over (an
/// UPDATE carries the object and the old object), far below an instance's
/// memory.
pub(crate) const MAX_PAYLOAD: usize = 8 << 20;

/// One instance's state: its WASI context, its memory limits, and the
/// conversation of the one call it serves.
pub(crate) struct Guest {
    pub wasi: WasiP1Ctx,
    pub budget: Budget,
    operation: Vec<u8>,
    request: Vec<u8>,
    pub(super) response: Option<Vec<u8>>,
    pub(super) error: Option<String>,
    host_response: Option<Vec<u8>>,
    host_error: Option<Vec<u8>>,
    handler: Arc<dyn CallHandler>,
}

impl Guest {
    pub fn new(
        wasi: WasiP1Ctx,
        budget: Budget,
        operation: &str,
        request: &[u8],
        handler: Arc<dyn CallHandler>,
    ) -> Guest {
        Guest {
            wasi,
            budget,
            operation: operation.as_bytes().to_vec(),
            request: request.to_vec(),
            response: None,
            error: None,
            host_response: None,
            host_error: None,
            handler,
        }
    }

    pub(crate) fn lengths(&self) -> (i32, i32) {
        (self.operation.len() as i32, self.request.len() as i32)
    }
}

/// What one instance may take: its linear memory stops at `memory_bytes`,
/// with an error the engine tells from any other trap.
pub struct Budget {
    pub memory_bytes: usize,
}

/// An instance asked for more memory than its budget.
#[derive(Debug, thiserror::Error)]
#[error("the policy's memory would grow to {desired} bytes, over its {limit}")]
pub(crate) struct OverBudget {
    pub desired: usize,
    pub limit: usize,
}

impl wasmtime::ResourceLimiter for Budget {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            return Err(OverBudget {
                desired,
                limit: self.memory_bytes,
            }
            .into());
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        // The policy's one table holds its functions; it never grows.
        Ok(desired <= 1 << 16)
    }
}

/// A guest's mistake about its own memory or the protocol: it ends that
/// instance's call with an error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProtocolError {
    #[error("the guest exports no memory")]
    NoMemory,
    #[error("the guest pointed outside its memory ({ptr} + {len})")]
    OutOfBounds { ptr: i32, len: i32 },
    #[error("the guest's {what} is {len} bytes, over the {MAX_PAYLOAD}-byte limit")]
    TooLarge { what: &'static str, len: usize },
}

fn memory(caller: &mut Caller<'_, Guest>) -> Result<Memory, ProtocolError> {
    match caller.get_export("memory") {
        Some(Extern::Memory(m)) => Ok(m),
        _ => Err(ProtocolError::NoMemory),
    }
}

/// The guest's bytes at `ptr..ptr + len`, checked.
fn read(caller: &mut Caller<'_, Guest>, ptr: i32, len: i32) -> Result<Vec<u8>, ProtocolError> {
    let out_of_bounds = ProtocolError::OutOfBounds { ptr, len };
    if len < 0 || ptr < 0 {
        return Err(out_of_bounds);
    }
    let (start, size) = (ptr as usize, len as usize);
    if size > MAX_PAYLOAD {
        return Err(ProtocolError::TooLarge {
            what: "payload",
            len: size,
        });
    }
    let memory = memory(caller)?;
    let end = start.checked_add(size).ok_or(ProtocolError::OutOfBounds { ptr, len })?;
    memory
        .data(&caller)
        .get(start..end)
        .map(<[u8]>::to_vec)
        .ok_or(out_of_bounds)
}

/// Writes `bytes` into the guest's memory at `ptr`, checked.
fn write(caller: &mut Caller<'_, Guest>, ptr: i32, bytes: &[u8]) -> Result<(), ProtocolError> {
    let out_of_bounds = ProtocolError::OutOfBounds {
        ptr,
        len: bytes.len() as i32,
    };
    if ptr < 0 {
        return Err(out_of_bounds);
    }
    let memory = memory(caller)?;
    let start = ptr as usize;
    let end = start.checked_add(bytes.len()).ok_or(ProtocolError::OutOfBounds {
        ptr,
        len: bytes.len() as i32,
    })?;
    let target = memory.data_mut(caller).get_mut(start..end).ok_or(out_of_bounds)?;
    target.copy_from_slice(bytes);
    Ok(())
}

/// A host call's answer, kept for the guest to fetch: 1 for a response, 0
/// for an error.
fn answer(guest: &mut Guest, result: Result<Vec<u8>, CallFailure>) -> i32 {
    guest.host_response = None;
    guest.host_error = None;
    match result {
        Ok(bytes) if bytes.len() > MAX_PAYLOAD => {
            let e = HostError::new(
                Code::TooLarge,
                format!(
                    "the host's answer is {} bytes, over the {MAX_PAYLOAD}-byte limit",
                    bytes.len()
                ),
            );
            guest.host_error = Some(e.to_bytes());
            0
        }
        Ok(bytes) => {
            guest.host_response = Some(bytes);
            1
        }
        Err(failure) => {
            guest.host_error = Some(failure.to_bytes());
            0
        }
    }
}

fn utf8(bytes: Vec<u8>, what: &'static str) -> Result<String, CallFailure> {
    String::from_utf8(bytes).map_err(|_| {
        CallFailure::Ours(HostError::new(
            Code::BadRequest,
            format!("the call's {what} is not UTF-8"),
        ))
    })
}

/// `__host_call`: the guest's call of the host, answered by the handler.
#[allow(clippy::too_many_arguments)]
fn host_call(
    mut caller: Caller<'_, Guest>,
    binding: (i32, i32),
    namespace: (i32, i32),
    operation: (i32, i32),
    payload: (i32, i32),
) -> wasmtime::Result<i32> {
    let parts = [binding, namespace, operation]
        .into_iter()
        .map(|(ptr, len)| read(&mut caller, ptr, len))
        .collect::<Result<Vec<_>, _>>()?;
    let payload = match read(&mut caller, payload.0, payload.1) {
        Err(ProtocolError::TooLarge { len, .. }) => {
            let e = HostError::new(
                Code::TooLarge,
                format!("the call's payload is {len} bytes, over the {MAX_PAYLOAD}-byte limit"),
            );
            return Ok(answer(caller.data_mut(), Err(CallFailure::Ours(e))));
        }
        other => other?,
    };
    let [binding, namespace, operation]: [Vec<u8>; 3] = parts.try_into().expect("three parts were read");
    let result = (|| {
        let binding = utf8(binding, "binding")?;
        let namespace = utf8(namespace, "namespace")?;
        let operation = utf8(operation, "operation")?;
        let handler = caller.data().handler.clone();
        handler.call(&binding, &namespace, &operation, &payload)
    })();
    Ok(answer(caller.data_mut(), result))
}

/// Adds the waPC imports (module `wapc`) to `linker`.
pub(crate) fn add_to_linker(linker: &mut Linker<Guest>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "wapc",
        "__guest_request",
        |mut caller: Caller<'_, Guest>, op_ptr: i32, ptr: i32| {
            let (operation, request) = {
                let guest = caller.data();
                (guest.operation.clone(), guest.request.clone())
            };
            write(&mut caller, ptr, &request)?;
            write(&mut caller, op_ptr, &operation)?;
            Ok(())
        },
    )?;
    linker.func_wrap(
        "wapc",
        "__guest_response",
        |mut caller: Caller<'_, Guest>, ptr: i32, len: i32| {
            let response = read(&mut caller, ptr, len)?;
            caller.data_mut().response = Some(response);
            Ok(())
        },
    )?;
    linker.func_wrap(
        "wapc",
        "__guest_error",
        |mut caller: Caller<'_, Guest>, ptr: i32, len: i32| {
            let error = read(&mut caller, ptr, len)?;
            caller.data_mut().error = Some(String::from_utf8_lossy(&error).into_owned());
            Ok(())
        },
    )?;
    linker.func_wrap(
        "wapc",
        "__host_call",
        |caller: Caller<'_, Guest>,
         bd_ptr: i32,
         bd_len: i32,
         ns_ptr: i32,
         ns_len: i32,
         op_ptr: i32,
         op_len: i32,
         ptr: i32,
         len: i32| { host_call(caller, (bd_ptr, bd_len), (ns_ptr, ns_len), (op_ptr, op_len), (ptr, len)) },
    )?;
    linker.func_wrap("wapc", "__host_response_len", |caller: Caller<'_, Guest>| {
        caller.data().host_response.as_ref().map_or(0, |r| r.len() as i32)
    })?;
    linker.func_wrap("wapc", "__host_response", |mut caller: Caller<'_, Guest>, ptr: i32| {
        let response = caller.data().host_response.clone().unwrap_or_default();
        write(&mut caller, ptr, &response)?;
        Ok(())
    })?;
    linker.func_wrap("wapc", "__host_error_len", |caller: Caller<'_, Guest>| {
        caller.data().host_error.as_ref().map_or(0, |e| e.len() as i32)
    })?;
    linker.func_wrap("wapc", "__host_error", |mut caller: Caller<'_, Guest>, ptr: i32| {
        let error = caller.data().host_error.clone().unwrap_or_default();
        write(&mut caller, ptr, &error)?;
        Ok(())
    })?;
    linker.func_wrap(
        "wapc",
        "__console_log",
        |mut caller: Caller<'_, Guest>, ptr: i32, len: i32| {
            let line = read(&mut caller, ptr, len)?;
            tracing::debug!(target: "config_snapshot::guest", "{}", String::from_utf8_lossy(&line));
            Ok(())
        },
    )?;
    Ok(())
}
