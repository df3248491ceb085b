-- Issue 16: what a candidate release is judged by.
--
-- hook_inputs keeps the bounded inputs of recorded hook invocations, by the
-- digest hook_invocations.input_digest already names (one row per distinct
-- input), so an activation can replay the last invocations of each slot
-- against a candidate. Inputs over the bound are not kept (not replayable).
-- at is the last time an invocation used it: pruning drops, per slot, what
-- none of the slot's recent invocations used.
CREATE TABLE hook_inputs (
    digest   TEXT    PRIMARY KEY,
    slot     TEXT    NOT NULL,
    input    TEXT    NOT NULL CHECK (json_valid(input)),
    bytes    INTEGER NOT NULL,
    at       INTEGER NOT NULL
);
CREATE INDEX hook_inputs_by_use ON hook_inputs(slot, at);
CREATE INDEX hook_invocations_by_slot ON hook_invocations(session_id, slot, id);

-- release_validations is the host's validation report of a release, the
-- newest per release and session: the host suite, each bound slot's answers
-- to its fixtures, the replay of recorded invocations, the candidate's own
-- tests (recorded, not authoritative) and its environment fingerprint.
CREATE TABLE release_validations (
    session_id   TEXT    NOT NULL REFERENCES sessions(id),
    release_id   TEXT    NOT NULL,
    ok           INTEGER NOT NULL CHECK (ok IN (0, 1)),
    report       TEXT    NOT NULL CHECK (json_valid(report)),
    validated_at INTEGER NOT NULL,
    PRIMARY KEY (session_id, release_id)
);

-- worker_crashes are the unasked deaths of workbench workers, by the epoch
-- they ran: too many soon after an activation roll the release back.
CREATE TABLE worker_crashes (
    id         INTEGER PRIMARY KEY,
    session_id TEXT    NOT NULL REFERENCES sessions(id),
    epoch      INTEGER NOT NULL,
    release_id TEXT    NOT NULL,
    role       TEXT    NOT NULL,
    reason     TEXT    NOT NULL DEFAULT '',
    at         INTEGER NOT NULL
);
CREATE INDEX worker_crashes_by_epoch ON worker_crashes(session_id, epoch, at);
