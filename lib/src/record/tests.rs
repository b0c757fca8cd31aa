use super::*;

fn sample() -> Lease {
    Lease {
        state: LeaseState::Held,
        heartbeat_seq: 7,
        heartbeat_at: "2026-11-29T16:08:33.123456Z".into(),
        lease_id: "0123456789abcdef0123456789abcdef".into(),
        token: 42,
        ttl_ms: 30_000,
        acquired_at: "2026-11-29T16:00:00.000000Z".into(),
        holder: Holder {
            pid: 4242,
            pid_start: 99,
            child_pid: None,
            child_start: None,
            pgid: None,
            host: "web1".into(),
            boot_id: "b".into(),
            pid_ns: 1,
            uid: 1000,
            user: "alice".into(),
            command: vec!["terraform".into(), "apply".into()],
            note: Some("hi \"there\"\n".into()),
            on_behalf: false,
        },
        ended: None,
        mode: None,
        history: Default::default(),
        damaged: false,
    }
}

#[test]
fn a_draft_finished_is_the_record_written_whole() {
    let mut l = sample();
    l.heartbeat_seq = 0;
    l.token = 0;
    // A note that mentions the token field must not confuse the draft.
    l.holder.note = Some("\n  \"token\": 1,".into());
    let d = Draft::new(l.clone()).expect("a draft");
    let now = "2026-11-29T17:01:02.345678Z";
    let (lease, bytes) = d.finish(18_446_744_073_709_551_615, now);
    let mut whole = l;
    whole.token = 18_446_744_073_709_551_615;
    whole.acquired_at = now.into();
    whole.heartbeat_at = now.into();
    assert_eq!(lease, whole);
    assert_eq!(bytes, whole.to_bytes());
    match Lease::parse(&bytes) {
        Parsed::Lease(p) => assert_eq!(*p, whole),
        other => panic!("{other:?}"),
    }
    let (_, small) = Draft::new(sample()).unwrap().finish(3, now);
    assert!(
        String::from_utf8(small)
            .unwrap()
            .contains("\"token\":                    3,")
    );
}

#[test]
fn roundtrip_and_is_valid_json() {
    let l = sample();
    let bytes = l.to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["state"], "held");
    assert_eq!(v["heartbeat_seq"], 7);
    match Lease::parse(&bytes) {
        Parsed::Lease(p) => assert_eq!(*p, l),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_revoked_record_keeps_the_header_layout_and_roundtrips() {
    let held = sample().to_bytes();
    let mut l = sample();
    l.state = LeaseState::Revoked;
    let bytes = l.to_bytes();
    assert_eq!(bytes.len(), held.len(), "the state field is fixed-width");
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["state"], "revoked");
    match Lease::parse(&bytes) {
        Parsed::Lease(p) => assert_eq!(*p, l),
        other => panic!("{other:?}"),
    }
}

#[test]
fn header_rewrite_keeps_length_and_validity() {
    let mut bytes = sample().to_bytes();
    let len = bytes.len();
    let at = "2026-11-29T16:09:00.000001Z";
    let region = Lease::rewrite_header(&mut bytes, LeaseState::Released, u64::MAX, at)
        .unwrap()
        .to_vec();
    assert_eq!(bytes.len(), len);
    assert_eq!(&bytes[MUTABLE_RANGE], &region[..]);
    match Lease::parse(&bytes) {
        Parsed::Lease(p) => {
            assert_eq!(p.state, LeaseState::Released);
            assert_eq!(p.heartbeat_seq, u64::MAX);
            assert_eq!(p.heartbeat_at, at);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_torn_mix_is_detected() {
    let old = sample().to_bytes();
    let mut new = old.clone();
    Lease::rewrite_header(&mut new, LeaseState::Held, 8, "2026-11-29T16:08:43.999999Z");
    for cut in MUTABLE_RANGE {
        let mut mix = new[..cut].to_vec();
        mix.extend_from_slice(&old[cut..]);
        let ok_whole = mix == old || mix == new;
        match Lease::parse(&mix) {
            Parsed::Lease(_) => assert!(ok_whole, "torn mix at {cut} accepted"),
            Parsed::Torn => assert!(!ok_whole),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn foreign_and_newer() {
    assert!(matches!(Lease::parse(b""), Parsed::Empty));
    assert!(matches!(Lease::parse(b" \n"), Parsed::Empty));
    assert!(matches!(Lease::parse(b"4242\n"), Parsed::NotALease(_)));
    assert!(matches!(
        Lease::parse(br#"{"leasehold": 9, "x": 1}"#),
        Parsed::Newer(9)
    ));
    assert!(matches!(
        Lease::parse(&[0u8, 159, 146, 150]),
        Parsed::NotALease(_)
    ));
    let deep = "[".repeat(100_000);
    assert!(matches!(
        Lease::parse(deep.as_bytes()),
        Parsed::NotALease(_)
    ));
}

#[test]
fn on_behalf_is_written_only_when_set_and_read_back() {
    let plain = sample().to_bytes();
    assert!(!String::from_utf8_lossy(&plain).contains("on_behalf"));
    let mut l = sample();
    l.holder.on_behalf = true;
    l.holder.child_pid = Some(4243);
    l.holder.child_start = Some(100);
    let bytes = l.to_bytes();
    assert!(String::from_utf8_lossy(&bytes).contains("\"on_behalf\": true"));
    match Lease::parse(&bytes) {
        Parsed::Lease(p) => assert_eq!(*p, l),
        other => panic!("{other:?}"),
    }
    // A reader of this version reads a record without the field as not on behalf.
    match Lease::parse(&plain) {
        Parsed::Lease(p) => assert!(!p.holder.on_behalf),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_shared_locks_record_is_format_2_and_reads_back_with_its_mode() {
    let mut l = sample();
    l.mode = Some(Mode {
        slots: Some(3),
        width: 2,
    });
    let b = l.to_bytes();
    // A format-1 leasehold accepts only its own prefix; anything else with a greater
    // "leasehold" number it refuses as newer (NewerFormat, exit 65; checked by hand against
    // the previous release, see PROTOCOL.md §13).
    assert!(b.starts_with(P_CHECKSUM_2.as_bytes()));
    assert!(!b.starts_with(P_CHECKSUM.as_bytes()));
    let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["leasehold"], 2);
    match Lease::parse(&b) {
        Parsed::Lease(back) => assert_eq!(*back, l),
        other => panic!("{other:?}"),
    }
    // A plain lease stays format 1.
    assert!(sample().to_bytes().starts_with(P_CHECKSUM.as_bytes()));
}

#[test]
fn a_mode_out_of_range_or_in_the_wrong_format_is_not_a_lease() {
    let with = |slots, width| {
        let mut l = sample();
        l.mode = Some(Mode { slots, width });
        l.to_bytes()
    };
    for bad in [
        with(Some(0), 0),
        with(Some(2), 3),
        with(None, MAX_WIDTH + 1),
    ] {
        assert!(matches!(Lease::parse(&bad), Parsed::NotALease(_)));
    }
    // Format 1 with a mode, format 2 without one.
    let v1_with_mode = String::from_utf8(with(Some(2), 1)).unwrap().replacen(
        "\"leasehold\": 2",
        "\"leasehold\": 1",
        1,
    );
    let mut v1 = v1_with_mode.into_bytes();
    seal(&mut v1);
    assert!(matches!(Lease::parse(&v1), Parsed::NotALease(_)));
    let v2_without = String::from_utf8(sample().to_bytes()).unwrap().replacen(
        "\"leasehold\": 1",
        "\"leasehold\": 2",
        1,
    );
    let mut v2 = v2_without.into_bytes();
    seal(&mut v2);
    assert!(matches!(Lease::parse(&v2), Parsed::NotALease(_)));
}

/// The record writer before it wrote in one buffer (an owned body serialised to a string, then
/// copied behind the header): kept to show the faster one writes the very same bytes.
fn to_bytes_reference(l: &Lease) -> Vec<u8> {
    #[derive(Serialize)]
    struct OwnedBody {
        lease_id: String,
        token: u64,
        ttl_ms: u64,
        acquired_at: String,
        holder: Holder,
        ended: Option<Ending>,
        #[serde(skip_serializing_if = "Option::is_none")]
        mode: Option<Mode>,
        #[serde(skip_serializing_if = "Option::is_none")]
        deadline: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        last_start: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        last: Option<LastEnding>,
        #[serde(skip_serializing_if = "Option::is_none")]
        acked: Option<Ack>,
    }
    let body = OwnedBody {
        lease_id: l.lease_id.clone(),
        token: l.token,
        ttl_ms: l.ttl_ms,
        acquired_at: l.acquired_at.clone(),
        holder: l.holder.clone(),
        ended: l.ended.clone(),
        mode: l.mode,
        deadline: l.history.deadline.clone(),
        last_start: l.history.last_start.clone(),
        last: l.history.last.clone(),
        acked: l.history.acked.clone(),
    };
    let mut body = serde_json::to_string_pretty(&body).unwrap();
    if let Some(start) = body.find(P_TOKEN).map(|i| i + P_TOKEN.len())
        && let Some(len) = body[start..].find(',')
    {
        body.replace_range(start..start + len, &format!("{:>TOKEN_W$}", l.token));
    }
    let mut out = String::new();
    out.push_str(match l.mode {
        None => P_CHECKSUM,
        Some(_) => P_CHECKSUM_2,
    });
    out.push_str(&"0".repeat(CHECKSUM_W));
    out.push_str(P_STATE);
    out.push_str(l.state.field());
    out.push_str(P_SEQ);
    out.push_str(&format!("{:>SEQ_W$}", l.heartbeat_seq));
    out.push_str(P_AT);
    out.push_str(&fixed_time(&l.heartbeat_at));
    out.push_str(P_END);
    out.push_str(body.strip_prefix("{\n").unwrap_or(&body));
    out.push('\n');
    let mut bytes = out.into_bytes();
    let sum = format!("{:016x}", checksum_reference(&bytes));
    bytes[OFF_CHECKSUM..OFF_CHECKSUM + CHECKSUM_W].copy_from_slice(sum.as_bytes());
    bytes
}

/// The checksum as first written: FNV-1a with a test per byte for the checksum's own field.
fn checksum_reference(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, &b) in bytes.iter().enumerate() {
        let b = if (OFF_CHECKSUM..OFF_CHECKSUM + CHECKSUM_W).contains(&i) {
            b'0'
        } else {
            b
        };
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Leases that exercise every field the writer has: optional ones set and unset, strings that
/// need escaping or are not ASCII, extreme numbers, heartbeat times too short, too long or
/// with characters the fixed-width header drops, and both format versions.
fn varied() -> Vec<Lease> {
    let mut out = vec![sample()];
    let mut l = sample();
    l.state = LeaseState::Released;
    l.heartbeat_seq = u64::MAX;
    l.token = 0;
    l.ttl_ms = 1;
    l.heartbeat_at = "short".into();
    l.holder.child_pid = Some(i32::MAX);
    l.holder.child_start = Some(u64::MAX);
    l.holder.pgid = Some(1);
    l.holder.host = "h\u{e9}\u{1f512}\t\\\"x\u{7f}\u{1}".into();
    l.holder.command = vec![String::new(), "a,b".into(), "\n  \"token\": 9,".into()];
    l.holder.note = None;
    l.holder.on_behalf = true;
    l.ended = Some(Ending {
        at: "2026-11-29T16:09:00.000000Z".into(),
        how: "exit 3".into(),
        by: Some("root@h pid 1".into()),
    });
    l.history = History {
        last: Some(LastEnding {
            end: crate::ending::EndKind::Fenced,
            at: Some("t".into()),
            host: "web2".into(),
            pid: 7,
            token: 41,
            status: Some(-1),
            signal: Some(9),
            how: Some("fenced: lease taken".into()),
            by: Some("u".into()),
            acked: Some(Ack {
                by: "op@h pid 2".into(),
                at: "a".into(),
            }),
        }),
        last_start: Some("2026-11-29T15:00:00.000000Z".into()),
        deadline: Some("2026-11-29T17:00:00.000000Z".into()),
        acked: Some(Ack {
            by: "op".into(),
            at: "b".into(),
        }),
    };
    out.push(l.clone());
    l.state = LeaseState::Revoked;
    l.heartbeat_at = "2026-11-29T16:08:33.123456Z and then some more".into();
    l.mode = Some(Mode {
        slots: Some(3),
        width: 2,
    });
    l.history.last = Some(LastEnding {
        end: crate::ending::EndKind::Died,
        at: None,
        host: String::new(),
        pid: -5,
        token: u64::MAX,
        status: None,
        signal: None,
        how: None,
        by: None,
        acked: None,
    });
    out.push(l.clone());
    l.mode = Some(Mode {
        slots: None,
        width: 1,
    });
    l.heartbeat_at = "\u{e9}\u{e9} 2026\u{0}-11".into();
    l.token = 12_345_678_901_234_567_890;
    out.push(l);
    out
}

#[test]
fn the_one_buffer_writer_writes_the_same_bytes_as_the_reference_writer() {
    for l in varied() {
        let bytes = l.to_bytes();
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            String::from_utf8_lossy(&to_bytes_reference(&l)),
            "{l:?}"
        );
        match Lease::parse(&bytes) {
            Parsed::Lease(_) => {}
            other => panic!("{other:?} for {l:?}"),
        }
    }
}

#[test]
fn the_checksum_in_three_runs_equals_the_per_byte_reference_at_every_length() {
    let record = sample().to_bytes();
    for len in 0..=record.len() {
        assert_eq!(
            checksum(&record[..len]),
            checksum_reference(&record[..len]),
            "{len}"
        );
    }
    // Bytes of every value, inside the checksum's field too.
    let all: Vec<u8> = (0..=255u8).cycle().take(700).collect();
    for len in [
        0,
        1,
        OFF_CHECKSUM,
        OFF_CHECKSUM + 1,
        OFF_CHECKSUM + CHECKSUM_W,
        700,
    ] {
        assert_eq!(
            checksum(&all[..len]),
            checksum_reference(&all[..len]),
            "{len}"
        );
    }
}
