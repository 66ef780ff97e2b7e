use super::failed::short_type_name;
use super::*;

#[test]
fn every_rule_displays_its_number_and_parses_back() {
    for &r in Rule::ALL {
        assert_eq!(Rule::from_name(&r.to_string()), Some(r));
        assert!(!r.statement().is_empty());
    }
    assert_eq!(Rule::R5_3.to_string(), "R5.3");
    assert_eq!(Rule::R12_5.to_string(), "R12.5");
    assert_eq!(Rule::from_name("R5.11"), None);
}

#[test]
fn failed_shows_its_cause_once_in_a_chain() {
    let f = Failure::new(Error::EmptyTeam, ());
    let cause = Error::EmptyTeam.to_string();
    assert_eq!(f.to_string(), cause);
    let mut chain = vec![f.to_string()];
    let mut s = std::error::Error::source(&f);
    while let Some(e) = s {
        chain.push(e.to_string());
        s = e.source();
    }
    assert_eq!(chain.iter().filter(|m| m.contains(&cause)).count(), 1);
}

#[test]
fn failed_debug_shows_the_error_and_which_value_came_back() {
    let f = Failure::new(Error::EmptyTeam, Device(3));
    let debug = format!("{f:?}");
    assert_eq!(debug, "Failed { error: EmptyTeam, value: Device }");
    let boxed: Box<dyn std::error::Error> = Box::new(f);
    assert_eq!(boxed.to_string(), Error::EmptyTeam.to_string());
    assert!(short_type_name::<Option<Vec<Device>>>() == "Option<Vec<Device>>");
}

#[test]
fn a_bad_environment_variable_names_itself_its_value_and_the_fix() {
    let e = Error::bad_environment(
        "CUDA_ENDPOINTS_DENY",
        "cuMulticastCreat",
        "no such entry point",
        "use cuda.h names",
    );
    let msg = e.to_string();
    for part in [
        "CUDA_ENDPOINTS_DENY",
        "\"cuMulticastCreat\"",
        "no such entry point",
        "use cuda.h names",
    ] {
        assert!(msg.contains(part), "{msg}");
    }
    assert!(!e.is_unsupported() && e.rule().is_none());
}

#[test]
fn unsupported_names_the_feature_its_rule_and_the_fix() {
    let e = Error::unsupported(Feature::UnicastOnClassic, Some(13000), "");
    let msg = e.to_string();
    assert!(msg.contains("on a classic unicast endpoint"), "{msg}");
    assert!(msg.contains("13000") && msg.contains("(C1)"), "{msg}");
    assert!(msg.ends_with(Feature::UnicastOnClassic.fix()), "{msg}");
    assert!(e.is_unsupported() && e.rule() == Some(Rule::C1));
    let missing = Error::FeatureMissing {
        device: Device(0),
        feature: Feature::CountedOps,
        attribute: 155,
        value: 0,
    };
    assert!(missing.is_unsupported() && missing.rule() == Some(Rule::R2_4));
}

#[test]
fn a_wrong_device_and_a_misaligned_value_read_as_words_with_the_value_to_use() {
    let e = Error::WrongDevice {
        device: Device(1),
        role: Role::Owner,
        allowed: vec![Device(0)],
        rule: Rule::R5_2,
    };
    assert!(e.to_string().ends_with("bind on one of: device 0"), "{e}");
    // As `bind` makes it: 4096 rounded up, the endpoint being large enough.
    let e = Error::Misaligned {
        what: Arg::BindOffset,
        value: 4096,
        alignment: 2 << 20,
        alignment_kind: Alignment::BindAlignment,
        suggested: 2 << 20,
        rule: Rule::R5_3,
    };
    let msg = e.to_string();
    assert!(
        msg.contains("(R5.3); use ")
            && msg.ends_with(
                " = 2097152 bytes, the next valid multiple up (or down, where up does not fit)"
            ),
        "{msg}"
    );
    assert!(!msg.contains("Device("), "{msg}");
}

#[test]
fn f9_a_copy_out_of_range_names_the_offset_or_the_size_that_fits() {
    let e = |offset, size| {
        Error::CopyOutOfRange {
            op: 3,
            what: Extent::EndpointRange,
            offset,
            size,
            limit: 4096,
        }
        .to_string()
    };
    let m = e(4090, 64);
    assert!(
        m.starts_with(
            "copy op 3: endpoint range: offset 4090 + size 64 bytes exceeds 4096 bytes (F9); "
        ) && m.ends_with("this size fits at an offset of at most 4032"),
        "{m}"
    );
    let m = e(u64::MAX, 64);
    assert!(
        m.ends_with("at most 4032 (the offset is past the end)"),
        "{m}"
    );
    let m = e(0, 8192);
    assert!(m.ends_with("a copy there is at most 4096 bytes"), "{m}");
}

#[test]
fn a_copy_past_a_peers_windows_names_the_peer_and_at_most_eight_spans() {
    let e = Error::CopyNoWindow {
        op: 0,
        id: 5,
        offset: 1 << 40,
        size: 64,
        known: 0,
        targets: 1,
        peer: Some(Box::new(PeerBound {
            rank: 3,
            device: Device(1),
            covered: (0..20u64).map(|i| (i * 4096, i * 4096 + 1024)).collect(),
        })),
    };
    let msg = e.to_string();
    assert!(msg.contains("rank 3's memory on this endpoint (its device 1) is reachable here only at bytes 0..1024, 4096..5120"), "{msg}");
    assert!(
        msg.contains("28672..29696, and 12 more: put inside"),
        "{msg}"
    );
    assert!(msg.len() < 600, "{} bytes: {msg}", msg.len());
    assert_eq!(e.rule(), Some(Rule::F9));
}

#[test]
fn a_copy_past_what_a_peer_bound_names_the_peer_its_bytes_and_the_fix_or_the_close() {
    let peer = |covered: Vec<(u64, u64)>| {
        Box::new(PeerBound {
            rank: 2,
            device: Device(1),
            covered,
        })
    };
    let e = Error::CopyPeerNotBound {
        op: 3,
        id: 5,
        offset: 4096,
        size: 64,
        peer: peer((0..20u64).map(|i| (i * 8192, i * 8192 + 1024)).collect()),
    };
    let msg = e.to_string();
    assert!(
        msg.starts_with("copy op 3: endpoint 5 bytes 4096..4160 are outside what rank 2 bound on its device 1 when the ranks last agreed (F9, R13.5")
            && msg.contains("it bound bytes 0..1024, 8192..9216")
            && msg.contains("and 12 more there: copy inside those bytes, or have rank 2 bind more there and agree again"),
        "{msg}"
    );
    assert!(msg.len() < 600, "{} bytes: {msg}", msg.len());
    assert_eq!(e.rule(), Some(Rule::F9));
    // After a close, until the next agreement.
    let e = Error::CopyPeerNotBound {
        op: 0,
        id: 5,
        offset: 0,
        size: 64,
        peer: peer(Vec::new()),
    };
    let msg = e.to_string();
    assert!(
        msg.contains("the ranks closed since (every rank stopped copying, so rank 2 may unbind): agree again on every rank (`agree_bound`)"),
        "{msg}"
    );
}

#[test]
fn predicates_read_the_13_5_codes() {
    let d = |raw| Error::driver(Call::BindMem, Code::from_raw(raw).unwrap());
    assert!(d(802).is_retryable() && d(919).is_retryable());
    assert!(!d(2).is_retryable() && d(2).is_resource_exhausted());
    assert!(d(47).is_resource_exhausted() && !d(47).is_retryable());
    assert!(d(801).is_unsupported() && !d(1).is_unsupported());
    assert!(d(919).to_string().contains("retry after a delay"));
}
