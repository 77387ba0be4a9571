//! Versioned migrations of the store's tables, applied when a store connects.
//!
//! Every table lives in the store's own PostgreSQL schema, created by the first migration run.
//! The schema's `migrations` table lists the versions applied. [`migrate`] takes a
//! transaction-scoped advisory lock named after the schema first, so that workers starting at
//! once apply each migration once, one after the other; a worker that finds a version newer
//! than it knows refuses to start ([`Error::SchemaTooNew`]) and changes nothing.

use crate::Error;

/// One migration: its version (from 1, without gaps), what it does, and its SQL (`{s}` is the
/// quoted schema name).
struct Migration {
    version: i32,
    description: &'static str,
    sql: &'static str,
}

/// Every migration, oldest first.
const MIGRATIONS: &[Migration] = &[
    MIGRATION_1,
    MIGRATION_2,
    MIGRATION_3,
    MIGRATION_4,
    MIGRATION_5,
    MIGRATION_6,
    MIGRATION_7,
    MIGRATION_8,
    MIGRATION_9,
    MIGRATION_10,
    MIGRATION_11,
];

/// The tables.
const MIGRATION_1: Migration = Migration {
    version: 1,
    description: "runs, journal, steps, failures, schemas, inbox, leases",
    sql: r#"
CREATE TABLE {s}.runs (
    run_id        text COLLATE "C" PRIMARY KEY,
    workflow      text COLLATE "C" NOT NULL,
    status        text NOT NULL
                  CHECK (status IN ('running', 'waiting', 'completed', 'failed', 'cancelled')),
    seq           bigint NOT NULL,
    wait_event    text COLLATE "C",
    wait_until_ms bigint,
    info          text NOT NULL
);
CREATE INDEX runs_status ON {s}.runs (status, workflow, run_id);

CREATE TABLE {s}.journal (
    run_id text COLLATE "C" NOT NULL,
    seq    bigint NOT NULL,
    record text NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE {s}.steps (
    run_id     text COLLATE "C" NOT NULL,
    seq        bigint NOT NULL,
    name       text COLLATE "C" NOT NULL,
    occurrence integer NOT NULL,
    record     text NOT NULL,
    PRIMARY KEY (run_id, seq, name, occurrence)
);

CREATE TABLE {s}.failures (
    run_id  text COLLATE "C" NOT NULL,
    seq     bigint NOT NULL,
    attempt integer NOT NULL,
    idx     integer NOT NULL,
    record  text NOT NULL,
    PRIMARY KEY (run_id, seq, attempt, idx)
);

CREATE TABLE {s}.schemas (
    hash        text PRIMARY KEY,
    description text NOT NULL
);

CREATE TABLE {s}.inbox (
    run_id    text COLLATE "C" NOT NULL,
    event_seq bigint NOT NULL,
    name      text COLLATE "C" NOT NULL,
    key       text COLLATE "C",
    delivered boolean NOT NULL DEFAULT false,
    record    text NOT NULL,
    PRIMARY KEY (run_id, event_seq)
);
CREATE INDEX inbox_pending ON {s}.inbox (run_id, name, event_seq) WHERE NOT delivered;
CREATE UNIQUE INDEX inbox_keys ON {s}.inbox (run_id, key) WHERE key IS NOT NULL;

CREATE TABLE {s}.leases (
    run_id     text COLLATE "C" PRIMARY KEY,
    token      bigint NOT NULL,
    owner      text NOT NULL,
    expires_ms bigint NOT NULL
);
CREATE SEQUENCE {s}.lease_tokens;
"#,
};

/// Workflow evolution: blocked runs, and each run's schema hash as a column, so that a
/// worker claims only the runs of the schemas it can route (backfilled from the rows).
const MIGRATION_2: Migration = Migration {
    version: 2,
    description: "runs: status 'blocked', schema column (backfilled) and the claim's index",
    sql: r#"
ALTER TABLE {s}.runs DROP CONSTRAINT runs_status_check;
ALTER TABLE {s}.runs ADD CONSTRAINT runs_status_check
    CHECK (status IN ('running', 'waiting', 'completed', 'failed', 'cancelled', 'blocked'));
ALTER TABLE {s}.runs ADD COLUMN schema text COLLATE "C";
UPDATE {s}.runs SET schema = info::json->>'schema';
ALTER TABLE {s}.runs ALTER COLUMN schema SET NOT NULL;
CREATE INDEX runs_claim ON {s}.runs (workflow, schema, run_id)
    WHERE status IN ('running', 'waiting');
"#,
};

/// Live workers: the schemas each worker routes, renewed at every claim, so that a run no
/// live worker can route is blocked (once) rather than left unclaimed (docs/postgres.md,
/// "Runs no live worker can route").
const MIGRATION_3: Migration = Migration {
    version: 3,
    description: "workers: the schemas each live worker routes, with an expiry",
    sql: r#"
CREATE TABLE {s}.workers (
    owner      text NOT NULL,
    workflow   text COLLATE "C" NOT NULL,
    schema     text COLLATE "C" NOT NULL,
    expires_ms bigint NOT NULL,
    PRIMARY KEY (workflow, schema, owner)
);
"#,
};

/// Named limits shared by every worker (limits.rs): each limit's last declaration (and the
/// lock of its takes), the places held (each tied to a run's lease), and the starts of the
/// rate window.
const MIGRATION_4: Migration = Migration {
    version: 4,
    description: "named limits: limits, limit_permits, limit_starts",
    sql: r#"
CREATE TABLE {s}.limits (
    name           text COLLATE "C" PRIMARY KEY,
    concurrent     integer,
    rate_n         integer,
    rate_period_ms bigint
);
CREATE TABLE {s}.limit_permits (
    id       bigserial PRIMARY KEY,
    name     text COLLATE "C" NOT NULL,
    run_id   text COLLATE "C" NOT NULL,
    token    bigint NOT NULL,
    taken_ms bigint NOT NULL
);
CREATE INDEX limit_permits_name ON {s}.limit_permits (name);
CREATE TABLE {s}.limit_starts (
    name  text COLLATE "C" NOT NULL,
    at_ms bigint NOT NULL
);
CREATE INDEX limit_starts_name ON {s}.limit_starts (name, at_ms);
"#,
};

/// Payloads at rest: the ids of the keys that sealed payloads in the store (`Write::Seal`),
/// so that a worker or CLI without a key refuses the store at once (docs/encryption.md).
const MIGRATION_5: Migration = Migration {
    version: 5,
    description: "sealing_keys: the keys that sealed payloads",
    sql: r#"
CREATE TABLE {s}.sealing_keys (
    key_id text COLLATE "C" PRIMARY KEY,
    at_ms  bigint NOT NULL
);
"#,
};

/// Searchable run attributes (loops-core's `Write::SetAttributes`): one row per run and key,
/// the value as its index bytes (`AttributeValue::index_bytes`, whose memcmp order is the
/// values' order, as `bytea` compares), and the btree index a search scans: by key, then
/// value, so that an equality or a range of one key is one index range.
const MIGRATION_6: Migration = Migration {
    version: 6,
    description: "attributes: searchable run attributes and their index",
    sql: r#"
CREATE TABLE {s}.attributes (
    run_id text COLLATE "C" NOT NULL,
    key    text COLLATE "C" NOT NULL,
    value  bytea NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE INDEX attributes_search ON {s}.attributes (key, value, run_id);
"#,
};

/// Child runs (loops-core's `Context::start_child`): each run's parent as a column (its row's
/// `parent.run_id`; no run had one before this version, so there is nothing to backfill),
/// and the index that finds a run's children: for a cancellation's cascade (the unfinished
/// ones, in the cancel's transaction) and for `Store::children`.
const MIGRATION_7: Migration = Migration {
    version: 7,
    description: "runs: parent column and its index (child runs)",
    sql: r#"
ALTER TABLE {s}.runs ADD COLUMN parent text COLLATE "C";
CREATE INDEX runs_parent ON {s}.runs (parent, run_id) WHERE parent IS NOT NULL;
"#,
};

/// Schedules (loops-core's `Write::PutSchedule` and its siblings): one row per schedule, its
/// `ScheduleInfo` as JSON, as redb keeps it.
const MIGRATION_8: Migration = Migration {
    version: 8,
    description: "schedules: runs started per tick",
    sql: r#"
CREATE TABLE {s}.schedules (
    name text COLLATE "C" PRIMARY KEY,
    info text NOT NULL
);
"#,
};

/// The one-round-trip commit of a lease holder's write (fast.rs; docs/postgres.md, "The
/// commit path"), one statement in a transaction of its own. It locks the lease row, then the
/// run's row (in the order of the two-round-trip path), and raises SQLSTATE `LP001` unless the
/// lease still has token `p_token` and has not expired on the server's clock, and the row's
/// text is `p_info`; the row is locked by its update to `p_new` (with its columns, as
/// `update_run` writes them), or `FOR UPDATE` if it does not change. Then the record
/// `p_record` at its key (`p_seq`: the journal's; with `p_step`, that step record's), whose
/// key taken is a unique violation; without a record, a key taken raises `LP001`. Under READ
/// COMMITTED each statement of the function sees what committed before it started, and a row
/// lock waited for is checked against the row's newest version: what it checks is what the
/// two-round-trip path would read under the same locks. Any error rolls the whole statement
/// back.
const MIGRATION_9: Migration = Migration {
    version: 9,
    description: "commit_one: a lease holder's guarded commit in one statement",
    sql: r#"
CREATE FUNCTION {s}.commit_one(
    p_run text, p_token bigint, p_info text,
    p_seq bigint, p_step text, p_occurrence integer, p_record text,
    p_status text, p_row_seq bigint, p_wait_event text, p_wait_until_ms bigint,
    p_new text, p_schema text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM {s}.leases
        WHERE run_id = p_run COLLATE "C" AND token = p_token
        AND expires_ms > (extract(epoch from clock_timestamp()) * 1000)::bigint
        FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the lease % of run % is no longer live', p_token, p_run
            USING ERRCODE = 'LP001';
    END IF;
    IF p_new IS NULL THEN
        PERFORM 1 FROM {s}.runs WHERE run_id = p_run COLLATE "C" AND info = p_info
            FOR UPDATE;
    ELSE
        UPDATE {s}.runs SET status = p_status, seq = p_row_seq, wait_event = p_wait_event,
            wait_until_ms = p_wait_until_ms, info = p_new, schema = p_schema
            WHERE run_id = p_run COLLATE "C" AND info = p_info;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the row of run % changed', p_run USING ERRCODE = 'LP001';
    END IF;
    IF p_record IS NOT NULL THEN
        IF p_step IS NULL THEN
            INSERT INTO {s}.journal (run_id, seq, record) VALUES (p_run, p_seq, p_record);
        ELSE
            INSERT INTO {s}.steps (run_id, seq, name, occurrence, record)
                VALUES (p_run, p_seq, p_step, p_occurrence, p_record);
        END IF;
    ELSIF p_seq IS NOT NULL THEN
        IF p_step IS NULL THEN
            PERFORM 1 FROM {s}.journal WHERE run_id = p_run COLLATE "C" AND seq = p_seq;
        ELSE
            PERFORM 1 FROM {s}.steps WHERE run_id = p_run COLLATE "C" AND seq = p_seq
                AND name = p_step COLLATE "C" AND occurrence = p_occurrence;
        END IF;
        IF FOUND THEN
            RAISE EXCEPTION 'a record of run % at seq % exists', p_run, p_seq
                USING ERRCODE = 'LP001';
        END IF;
    END IF;
END
$$;
"#,
};

/// The check value of each sealing key (`PayloadCodec::key_check`), so that a key of the
/// same id and other bytes is refused before it seals (`Error::KeyMismatch`). Keys recorded
/// before have none.
const MIGRATION_10: Migration = Migration {
    version: 10,
    description: "sealing_keys.key_check: the check value of each sealing key",
    sql: "ALTER TABLE {s}.sealing_keys ADD COLUMN key_check text;",
};

/// The one-round-trip commit of the lease holders' writes that queued together (fast.rs;
/// docs/postgres.md, "The commit path"): one statement, in a transaction of its own, whose
/// arrays hold one write at each index, with `commit_one`'s parameters. For each write in
/// turn it locks the lease row and checks that it still has the token and has not expired on
/// the server's clock, then locks the run's row where its text is `p_info`, then inserts the
/// record at its key (`ON CONFLICT DO NOTHING`) or checks that the key is free when the write
/// has none, and last updates the row to `p_new` (if the row changes). Its locks are taken
/// `SKIP LOCKED`: a row another transaction holds is not waited for, so a run's row locked
/// elsewhere holds up no other write of the statement, and the statement waits for no lock
/// (no deadlock). A write whose lease or row changed or is locked elsewhere, or whose key is
/// taken, writes nothing and is `false` in the result; the others commit. `commit_one` stays
/// for the workers of the previous build during a rolling deploy.
const MIGRATION_11: Migration = Migration {
    version: 11,
    description: "commit_batch: the guarded commits of many lease holders in one statement",
    sql: r#"
CREATE FUNCTION {s}.commit_batch(
    p_run text[], p_token bigint[], p_info text[],
    p_seq bigint[], p_step text[], p_occurrence integer[], p_record text[],
    p_status text[], p_row_seq bigint[], p_wait_event text[], p_wait_until_ms bigint[],
    p_new text[], p_schema text[])
RETURNS boolean[] LANGUAGE plpgsql AS $$
DECLARE
    done boolean[] := '{}';
    ok boolean;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_run, 1), 0) LOOP
        PERFORM 1 FROM {s}.leases
            WHERE run_id = p_run[i] COLLATE "C" AND token = p_token[i]
            AND expires_ms > (extract(epoch from clock_timestamp()) * 1000)::bigint
            FOR UPDATE SKIP LOCKED;
        ok := FOUND;
        IF ok THEN
            PERFORM 1 FROM {s}.runs WHERE run_id = p_run[i] COLLATE "C" AND info = p_info[i]
                FOR UPDATE SKIP LOCKED;
            ok := FOUND;
        END IF;
        IF ok AND p_record[i] IS NOT NULL THEN
            IF p_step[i] IS NULL THEN
                INSERT INTO {s}.journal (run_id, seq, record)
                    VALUES (p_run[i], p_seq[i], p_record[i]) ON CONFLICT DO NOTHING;
            ELSE
                INSERT INTO {s}.steps (run_id, seq, name, occurrence, record)
                    VALUES (p_run[i], p_seq[i], p_step[i], p_occurrence[i], p_record[i])
                    ON CONFLICT DO NOTHING;
            END IF;
            ok := FOUND;
        ELSIF ok AND p_seq[i] IS NOT NULL THEN
            IF p_step[i] IS NULL THEN
                PERFORM 1 FROM {s}.journal WHERE run_id = p_run[i] COLLATE "C" AND seq = p_seq[i];
            ELSE
                PERFORM 1 FROM {s}.steps WHERE run_id = p_run[i] COLLATE "C" AND seq = p_seq[i]
                    AND name = p_step[i] COLLATE "C" AND occurrence = p_occurrence[i];
            END IF;
            ok := NOT FOUND;
        END IF;
        IF ok AND p_new[i] IS NOT NULL THEN
            UPDATE {s}.runs SET status = p_status[i], seq = p_row_seq[i],
                wait_event = p_wait_event[i], wait_until_ms = p_wait_until_ms[i],
                info = p_new[i], schema = p_schema[i]
                WHERE run_id = p_run[i] COLLATE "C";
        END IF;
        done := done || ok;
    END LOOP;
    RETURN done;
END
$$;
"#,
};

/// The newest schema version this build knows (and creates).
pub const SCHEMA_VERSION: i32 = 11;

/// Checks, writing nothing, that schema `schema` is at [`SCHEMA_VERSION`]. Returns it.
pub(crate) async fn check(client: &tokio_postgres::Client, schema: &str) -> Result<i32, Error> {
    let failed = |cause| Error::Migrate {
        schema: schema.to_owned(),
        version: 0,
        cause,
    };
    let table = format!("\"{schema}\".migrations");
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&table])
        .await
        .map_err(failed)?
        .get(0);
    let found: i32 = if exists {
        client
            .query_one(
                &format!("SELECT coalesce(max(version), 0) FROM \"{schema}\".migrations"),
                &[],
            )
            .await
            .map_err(failed)?
            .get(0)
    } else {
        0
    };
    match found {
        SCHEMA_VERSION => Ok(found),
        found if found > SCHEMA_VERSION => Err(Error::SchemaTooNew {
            schema: schema.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        }),
        found => Err(Error::NotMigrated {
            schema: schema.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        }),
    }
}

/// Creates the schema `schema` if needed and applies the migrations it lacks, in one
/// transaction under an advisory lock. Returns the version the schema is at.
pub(crate) async fn migrate(
    client: &mut tokio_postgres::Client,
    schema: &str,
) -> Result<i32, Error> {
    let s = format!("\"{schema}\"");
    let failed = |version: i32| {
        let schema = schema.to_owned();
        move |cause: tokio_postgres::Error| Error::Migrate {
            schema: schema.clone(),
            version,
            cause,
        }
    };
    let tx = client.transaction().await.map_err(failed(0))?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('loops-postgres:' || $1, 0))",
        &[&schema],
    )
    .await
    .map_err(failed(0))?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {s}; \
         CREATE TABLE IF NOT EXISTS {s}.migrations ( \
             version     integer PRIMARY KEY, \
             description text NOT NULL, \
             applied_at  timestamptz NOT NULL DEFAULT now())"
    ))
    .await
    .map_err(failed(0))?;
    let found: i32 = tx
        .query_one(
            &format!("SELECT coalesce(max(version), 0) FROM {s}.migrations"),
            &[],
        )
        .await
        .map_err(failed(0))?
        .get(0);
    if found > SCHEMA_VERSION {
        return Err(Error::SchemaTooNew {
            schema: schema.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for migration in MIGRATIONS.iter().filter(|m| m.version > found) {
        tx.batch_execute(&migration.sql.replace("{s}", &s))
            .await
            .map_err(failed(migration.version))?;
        tx.execute(
            &format!("INSERT INTO {s}.migrations (version, description) VALUES ($1, $2)"),
            &[&migration.version, &migration.description],
        )
        .await
        .map_err(failed(migration.version))?;
        tracing::info!(
            schema,
            version = migration.version,
            "applied migration: {}",
            migration.description
        );
    }
    tx.commit().await.map_err(failed(SCHEMA_VERSION))?;
    Ok(SCHEMA_VERSION.max(found))
}
