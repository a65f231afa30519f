"""Secret screening of job settings: secrets refused by setting name and kind, never echoed; real work passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_remote_compute.errors import SecretInSettings
from jupyter_remote_compute.guards import screen_settings

DATA = Path(__file__).parent / "data"
ADVICE = "Store it in the Secret Manager (jupyter remote-compute secrets set NAME) and reference it as secret:NAME."


def _load(name: str, columns: int) -> list[tuple[list[str], str | list[str]]]:
    rows = []
    for line in (DATA / name).read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        assert len(parts) == columns, f"{name}: malformed line {line[:40]!r}"
        raw = parts[-1]
        value = json.loads(raw) if raw[:1] in '["' else raw
        rows.append((parts[:-1], value))
    return rows


SECRETS = _load("secret_corpus.txt", 4)
BENIGN = _load("benign_corpus.txt", 2)


def _refusal(settings: dict[str, object], stored: tuple[str, ...] = ()) -> SecretInSettings:
    with pytest.raises(SecretInSettings) as info:
        screen_settings(settings, stored)
    return info.value


def _assert_not_leaked(exc: SecretInSettings, secret: str, value: str | list[str] = ()) -> None:
    """Neither the value nor any 8-character slice of the secret in it shows in anything the error carries."""
    texts = (str(exc), repr(exc), json.dumps(exc.to_json()))
    for text in texts:
        for part in [value] if isinstance(value, str) else value:
            assert len(part) < 8 or part not in text
        for i in range(len(secret) - 7):
            assert secret[i : i + 8] not in text, f"slice {i} of the secret leaked"
    # A chained exception would carry whatever raised it; screening raises fresh.
    assert exc.__cause__ is None and exc.__context__ is None


def test_corpora_are_large_enough() -> None:
    assert len(SECRETS) >= 50
    assert len(BENIGN) >= 50


@pytest.mark.parametrize(
    ("setting", "field", "secret", "value"),
    [(*k, v) for k, v in SECRETS],
    ids=[f"{i:02d}-{k[1]}" for i, (k, _) in enumerate(SECRETS)],
)
def test_secret_is_refused_by_field_without_echoing_it(
    setting: str, field: str, secret: str, value: str | list[str]
) -> None:
    assert secret in (value if isinstance(value, str) else json.dumps(value)), "corpus: secret part not in value"
    exc = _refusal({"name": "nightly-sft", setting: value, "send[0]": "data/train.csv"})

    assert exc.field == field
    assert exc.message.startswith(f"{field}: looks like ")
    assert exc.to_json() == {"code": "secret_in_settings", "message": exc.message, "field": field}
    _assert_not_leaked(exc, secret, value)


def test_benign_settings_pass_with_at_most_one_false_positive() -> None:
    refused = []
    for (setting,), value in BENIGN:
        try:
            screen_settings({setting: value})
        except SecretInSettings as exc:
            refused.append(f"{setting}={value!r}: {exc.message}")
    assert len(refused) <= 1, "false positives:\n" + "\n".join(refused)


def test_message_names_setting_and_kind() -> None:
    exc = _refusal({"env.AWS_SECRET": "FAKEc2LufYNuydk9sgEWl2agE4aE+Yhc3a+LcBfS"})
    assert exc.message == f"env.AWS_SECRET: looks like an AWS secret access key. {ADVICE}"


@pytest.mark.parametrize(
    ("settings", "kind"),
    [
        ({"env.X": "AKIAFAKEEXAMPLE00001"}, "an AWS access key ID"),
        ({"env.X": "hf_FAKElRDZqbyNmuNwNroWEsgjqHoHzkbacC"}, "a Hugging Face token"),
        ({"env.X": "glpat-FAKE4b8gjmbX5BSDbnQX"}, "a GitLab token"),
        ({"env.X": "sk-proj-FAKEQhNKAYJE3ZDda1RhUayZFQUzboYRrhoL3fbolcHMx0kqg"}, "an OpenAI API key"),
        ({"command": "python t.py --db postgresql://u:FakePass42@db/x"}, "a password inside a URL"),
        ({"command": "python t.py --password=Sup3rFakePass"}, "a password"),
        ({"env.SA": '{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\nFAKE"}'}, "a Google"),
        ({"env.X": "-----BEGIN EC PRIVATE KEY-----\nFAKE\n-----END EC PRIVATE KEY-----"}, "a private key"),
        ({"env.X": "qx1f6z4yfTcCpHTAkclFYhc9mH177FzI2NI-IuVbtJUbufue"}, "a random key or token"),
    ],
)
def test_kind_of_secret_is_named(settings: dict[str, object], kind: str) -> None:
    assert f": looks like {kind}" in _refusal(settings).message


def test_secret_references_pass() -> None:
    screen_settings(
        {
            "env.HF_TOKEN": "secret:hf",
            "env.AWS_SECRET_ACCESS_KEY": "secret:aws/prod-training",
            "env.DB_PASSWORD": "secret:db.password",
            "env.OPENAI_API_KEY": "secret:OpenAI-Prod-Key-01",
            "env.WANDB_API_KEY": "secret:wandb/Key2026",
            "command": ["python", "train.py", "--token", "secret:hf-token", "--api-key=secret:openai"],
        }
    )


def test_a_reference_does_not_hide_a_literal_next_to_it() -> None:
    key = "sk-FAKElMvGIMskFk8di05IoIbgAEzrm8PqBCB64fo9"
    assert _refusal({"command": f"python t.py --token secret:hf --openai-key {key}"}).field == "command"


def test_stored_secret_is_refused_on_exact_match_and_inside_a_longer_value() -> None:
    stored = ("correct-horse-battery", "short")
    # Nothing about this value looks secret; only the Secret Manager knows it is one.
    screen_settings({"env.NOTE": "correct-horse-battery"})

    exact = _refusal({"env.NOTE": "correct-horse-battery"}, stored)
    inside = _refusal({"command": "python t.py --tag=correct-horse-battery-2"}, stored)
    in_argv = _refusal({"command": ["python", "t.py", "x", "--label", "xcorrect-horse-batteryx"]}, stored)

    assert exact.field == "env.NOTE" and inside.field == "command" and in_argv.field == "command[4]"
    for exc in (exact, inside, in_argv):
        assert "a value stored in the Secret Manager" in exc.message
        assert "Reference it as secret:NAME" in exc.message
        _assert_not_leaked(exc, "correct-horse-battery", "correct-horse-battery")


def test_stored_secrets_are_read_only_when_a_setting_could_hold_one() -> None:
    reads = []

    def stored() -> list[str]:
        reads.append(1)
        return ["hunter22"]

    # Nothing the user wrote is 6 characters long (the shortest stored value that counts): no read.
    screen_settings({"name": "", "command[0]": "true", "env.A": "1"}, stored)
    assert reads == []
    # A long enough value or nested key is read against them, and a stored value in it is refused.
    with pytest.raises(SecretInSettings) as in_value:
        screen_settings({"command[0]": "x-hunter22"}, stored)
    assert in_value.value.field == "command[0]" and reads == [1]
    with pytest.raises(SecretInSettings) as in_name:
        screen_settings({"env.hunter22": "1"}, stored)
    assert in_name.value.field == "env" and reads == [1, 1]


def test_no_detect_secrets_pattern_is_shorter_than_the_screening_assumes() -> None:
    # Below this length screening does not load detect-secrets at all; a library update must not break that.
    import re._parser as sre_parse  # the parser CPython's re compiles with

    from jupyter_remote_compute.guards import screening

    detectors = screening._detectors()
    plugins = [p for p, _ in detectors.plugins] + [detectors.basic_auth]
    shortest = min(sre_parse.parse(r.pattern).getwidth()[0] for p in plugins for r in p.denylist)
    assert shortest >= screening.SHORTEST_PLUGIN_MATCH


def test_short_stored_values_are_ignored() -> None:
    # "short" and "abc12" would match ordinary text; a 6-character value already counts.
    screen_settings({"command": "python short.py --id abc123"}, ("short", "abc12"))
    assert _refusal({"command": "python t.py --id abc123"}, ("abc123",)).field == "command"


def test_digest_length_hex_passes_alone_but_not_under_a_secret_name() -> None:
    sha1 = "49b4884775eed1a9ec302011936fed2c9af2964e"
    md5 = "93e1d386930b6e38a0be18e6321f91ee"
    screen_settings({"command": f"python t.py --commit {sha1} --checksum {md5}", "env.GIT_COMMIT": sha1})

    assert _refusal({"command": f"TOKEN={sha1} python t.py"}).field == "command"
    assert _refusal({"env.WANDB_API_KEY": sha1}).field == "env.WANDB_API_KEY"
    assert _refusal({"command": ["python", "t.py", "--api-key", md5]}).field == "command[3]"
    # Same alphabet, a length no digest has: a key.
    assert _refusal({"env.X": "2e91e9d258048db6d83c2c503cb28b229aad3dc049e1c08e"}).field == "env.X"


def test_option_and_value_in_flattened_argv_elements_are_read_together() -> None:
    argv = {"command[0]": "python", "command[1]": "t.py", "command[2]": "--token", "command[3]": "FAKEtok3n42xy"}
    assert _refusal(argv).field == "command[3]"
    # Out-of-order keys still form one vector.
    exc = _refusal({"command[3]": "FAKEtok3n42xy", "command[2]": "--token", "command[0]": "python"})
    assert exc.field == "command[3]"


def test_model_vocabulary_named_like_credentials_passes() -> None:
    screen_settings(
        {
            "command": "python t.py --pad-token '[PAD]' --max-tokens 4096 --token-file /run/secrets/hf --secret-name x",
            "env.TOKENIZERS_PARALLELISM": "false",
            "env.HF_TOKEN_PATH": "~/.cache/huggingface/token",
            "env.PASSWORD_FILE": "/run/secrets/db",
        }
    )


def test_nested_env_mapping_is_named_by_dotted_field() -> None:
    exc = _refusal({"env": {"HF_TOKEN": "hf_FAKElRDZqbyNmuNwNroWEsgjqHoHzkbacC", "OK": "1"}})
    assert exc.field == "env.HF_TOKEN"


def test_a_secret_used_as_a_setting_name_is_not_echoed() -> None:
    name = "ghp_FAKEFAYuMS8yxX64mT6PWwMoF7napEEiee4e"
    exc = _refusal({f"env.{name}": "1"})
    assert exc.field == "env"
    _assert_not_leaked(exc, name, name)


def test_values_that_are_not_text_are_skipped() -> None:
    screen_settings({"name": None, "timeout": 3600, "send": [], "command": ""})


@pytest.mark.timeout(60)  # a regex that backtracks catastrophically on these takes hours, not seconds
def test_screening_stays_linear_on_long_values() -> None:
    settings = {f"send[{i}]": f"data/shards/train-{i:05d}-of-01024.parquet" for i in range(500)}
    settings["command"] = "torchrun --nproc_per_node=8 train.py " + " ".join(f"--opt{i} {i}e-4" for i in range(200))
    screen_settings({"command": "python train.py"})  # the detectors load on first use: not what is timed here
    screen_settings(settings, [f"stored-secret-{i:04d}" for i in range(50)])
    # Pathological long values must not blow up regex matching.
    for long_value in ("a" * 100_000, "eyJ" + "a" * 100_000, "https://" + "a:" * 40_000):
        screen_settings({"command": long_value})
