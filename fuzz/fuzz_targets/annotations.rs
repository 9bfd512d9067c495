#![no_main]
//! The annotation parsers: source lists and Go durations.

use config_snapshot_policy::model::duration::parse_go_duration;
use config_snapshot_policy::model::optin::OptIn;
use config_snapshot_policy::model::selection::SourceList;
use config_snapshot_policy::model::settings::Settings;
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fuzz_target!(|data: (String, String, String, bool)| {
    let (list, duration, exclude, wildcard) = data;
    if let Err(e) = SourceList::parse("config-snapshot.io/snapshot", &list, wildcard) {
        assert!(e.to_string().starts_with("config-snapshot.io/snapshot"), "{e}");
    }
    let _ = parse_go_duration(&duration);
    let annotations = json!({
        "config-snapshot.io/snapshot": list,
        "config-snapshot.io/renew-duration": duration,
        "config-snapshot.io/exclude": exclude,
    });
    if let Err(e) = OptIn::from_annotations(annotations.as_object(), &Settings::default()) {
        assert!(
            e.to_string().starts_with("config-snapshot.io/"),
            "error does not name the annotation: {e}"
        );
    }
});
