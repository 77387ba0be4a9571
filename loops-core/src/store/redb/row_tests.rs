use super::*;

/// A row with every optional field set or not as `mask`'s bits say, over every status.
fn row_of(mask: u16, status: RunStatus) -> RunInfo {
    let has = |bit: u16| mask & bit != 0;
    RunInfo {
        run_id: "run-1".to_owned(),
        workflow: "deliver".to_owned(),
        schema: SchemaHash::from_u64(0xfbca_108f_e01a_13f4),
        status,
        state: "Planned".to_owned(),
        seq: u64::MAX - 3,
        attempt: 7,
        attempt_base: 2,
        interrupted: 1,
        created_ms: 1_796_215_152_222,
        updated_ms: 1_796_215_152_999,
        retry_at_ms: has(1).then_some(1_796_215_160_000),
        error: has(2).then(|| vec!["outer".to_owned(), "the cause: \"quoted\" ü".to_owned()]),
        cancel: has(4).then(String::new),
        wait: has(8).then(|| WaitInfo {
            event: has(16).then(|| "approve".to_owned()),
            until_ms: has(32).then_some(u64::MAX),
        }),
        block: has(64).then(|| {
            BlockInfo::new(
                "no version has its schema",
                if has(256) {
                    vec!["state `A` gained field `x`".to_owned(), String::new()]
                } else {
                    Vec::new()
                },
                SchemaHash::from_u64(1),
                5,
                RunStatus::Waiting,
            )
        }),
        entered: has(128).then_some(3),
        parent: has(256).then(|| ParentLink {
            run_id: "parent/ü".to_owned(),
            on_cancel: if has(1) {
                OnParentCancel::Abandon
            } else {
                OnParentCancel::Cancel
            },
        }),
        key_nonce: has(512).then_some(u64::MAX - 7),
    }
}

/// An error and its cause, as the CLI prints them.
fn text(e: &Error) -> String {
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

const HEAD: Head = Head {
    last_entry: 41,
    last_transition: 40,
};

#[test]
fn every_row_reads_back_as_it_was_written() {
    for status in RunStatus::ALL {
        for mask in 0..1024 {
            let info = row_of(mask, status);
            let bytes = encode(HEAD, &info);
            assert_eq!(decode("run-1", &bytes).unwrap(), (HEAD, info.clone()));
            assert_eq!(head("run-1", &bytes).unwrap(), HEAD);
            // The lean read says what the whole row's readiness says.
            assert_eq!(
                readiness("run-1", &bytes).unwrap(),
                (info.schema, info.readiness()),
                "{info:?}"
            );
        }
    }
}

#[test]
fn a_parked_run_s_row_is_compact() {
    let info = RunInfo {
        workflow: "parked".to_owned(),
        state: "Park".to_owned(),
        wait: Some(WaitInfo {
            event: Some("go".to_owned()),
            until_ms: None,
        }),
        ..row_of(0, RunStatus::Waiting)
    };
    let bytes = encode(HEAD, &info);
    // Head 16, fixed fields 48, "parked" 4 + 6, "Park" 4 + 4, "go" 4 + 2.
    assert_eq!(bytes.len(), 16 + 48 + 10 + 8 + 6);
    assert!(
        bytes.len() * 2 < HEAD_LEN + info.encode().len(),
        "JSON is {} bytes",
        info.encode().len()
    );
}

#[test]
fn a_damaged_row_is_an_error_naming_the_run_never_a_panic() {
    let info = row_of(1023, RunStatus::Blocked);
    let bytes = encode(HEAD, &info);
    // Cut anywhere: refused.
    for len in 0..bytes.len() {
        let e = decode("run-1", &bytes[..len]).unwrap_err();
        assert!(
            text(&e).starts_with("run `run-1`: run row does not decode: "),
            "{e}"
        );
        if len < HEAD_LEN {
            assert!(head("run-1", &bytes[..len]).is_err());
        }
    }
    let damaged = |at: usize, value: u8| {
        let mut b = bytes.clone();
        b[at] = value;
        let e = decode("run-1", &b).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Decode {
                    record: RecordKind::RunRow,
                    ..
                }
            ),
            "{e:?}"
        );
        std::error::Error::source(&e).unwrap().to_string()
    };
    let mut b = bytes.clone();
    b[HEAD_LEN] = 2;
    assert_eq!(
        text(&decode("run-1", &b).unwrap_err()),
        "run `run-1`: run row does not decode: an encoding version this build does not read at byte 16"
    );
    assert_eq!(damaged(HEAD_LEN + 1, 200), "an unknown status at byte 17");
    assert_eq!(
        damaged(HEAD_LEN + 3, 0xff),
        "fields this build does not know (a row of a newer loops, or damaged) at byte 18"
    );
    // A string's length beyond the row, a string not UTF-8, a list longer than the row.
    let workflow = HEAD_LEN + 48;
    assert_eq!(damaged(workflow, 0xff), "a string cut short at byte 64");
    assert_eq!(damaged(workflow + 4, 0xff), "a string not UTF-8 at byte 64");
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(text(&decode("run-1", &longer).unwrap_err()).contains("bytes after the last field"));
    // The error chain's count (right after the optional fields): beyond the row.
    let plain = RunInfo {
        error: Some(vec!["e".to_owned()]),
        ..row_of(0, RunStatus::Failed)
    };
    let mut b = encode(HEAD, &plain);
    let count = b.len() - 9;
    b[count..count + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(text(&decode("run-1", &b).unwrap_err()).contains("a list longer than the row at byte"));
    // A wait's fields without a wait.
    let mut b = encode(HEAD, &row_of(0, RunStatus::Waiting));
    b[HEAD_LEN + 2] = HAS_WAIT_EVENT as u8;
    assert!(
        text(&decode("run-1", &b).unwrap_err())
            .ends_with("a wait's fields without a wait at byte 18")
    );
}
