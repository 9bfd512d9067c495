//! What every handler needs to know about the request it serves: the host
//! to call, the settings, the request's namespace and whether it is a dry
//! run. Its own module, below every handler, so that the handlers and the
//! helpers they share (checksum mode, the sweep) depend on it and not on
//! each other.

use crate::host::HostApi;
use crate::model::settings::Settings;

pub struct Context<'a> {
    pub host: HostApi<'a>,
    pub settings: &'a Settings,
    pub namespace: &'a str,
    pub dry_run: bool,
}
