"""Refuse job settings that hold what looks like a secret.

A job's settings end up in the state file, in logs and on the far machine, so a
literal credential typed into them would leak. Screening runs on every submit and
refuses such values, naming the setting and the kind of secret but never the value:
the error itself is shown, logged and returned over HTTP.

Detection is layered, most specific first: the provider formats that the
``detect-secrets`` library knows (its regex plugins, called in-process, so none of
its network verification or global settings are touched), our own formats it lacks
or is too strict about, values already stored in the Secret Manager, values given
to secret-named options or variables, and finally random-looking strings.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..errors import SecretInSettings

__all__ = ["MIN_STORED_SECRET_LENGTH", "screen_settings"]

# Shorter stored values ("admin", "1234") would match ordinary text everywhere.
MIN_STORED_SECRET_LENGTH = 6

_ADVICE = "Store it in the Secret Manager (jupyter remote-compute secrets set NAME) and reference it as secret:NAME."
_STORED = "a value stored in the Secret Manager"
_STORED_ADVICE = "Reference it as secret:NAME instead of writing it out."

# A reference to the Secret Manager; it is resolved at start and is not a secret itself.
_REFERENCE = re.compile(r"(?<![\w:/.-])secret:[A-Za-z0-9][A-Za-z0-9_./-]*")
_REFERENCE_STAND_IN = "$SECRET_REF"
# A list element's flattened name, ``command[0]``.
_ELEMENT_NAME = re.compile(r"[A-Za-z_][\w.]*\[\d+\]")

# --- detect-secrets plugins: one instance each, built on first use ------------------------------
# Importing detect-secrets costs more than the rest of a no-op job (it imports requests for its
# network checks, which are never called here), so it is loaded only for a text long enough to match.
#: No pattern of the plugins below matches fewer characters (JWT's ``eyJ<x>.<y>``; test_screening checks).
SHORTEST_PLUGIN_MATCH = 6


@dataclasses.dataclass(frozen=True)
class _Detectors:
    plugins: tuple[tuple[Any, str], ...]  # each with the kind of secret named to the user
    base64_entropy: Any  # only their entropy measures are used: their matching wants quoted strings
    hex_entropy: Any
    basic_auth: Any  # checked separately: a placeholder password in a URL (``user:$PASS@``) is not a secret


def load_detectors() -> None:
    """Import and build the detectors now (~0.3 s), not during the first screening someone waits on."""
    _detectors()


@functools.cache
def _detectors() -> _Detectors:
    from detect_secrets.plugins.aws import AWSKeyDetector
    from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
    from detect_secrets.plugins.basic_auth import BasicAuthDetector
    from detect_secrets.plugins.discord import DiscordBotTokenDetector
    from detect_secrets.plugins.github_token import GitHubTokenDetector
    from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
    from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString, HexHighEntropyString
    from detect_secrets.plugins.jwt import JwtTokenDetector
    from detect_secrets.plugins.mailchimp import MailchimpDetector
    from detect_secrets.plugins.npm import NpmDetector
    from detect_secrets.plugins.openai import OpenAIDetector
    from detect_secrets.plugins.private_key import PrivateKeyDetector
    from detect_secrets.plugins.pypi_token import PypiTokenDetector
    from detect_secrets.plugins.sendgrid import SendGridDetector
    from detect_secrets.plugins.slack import SlackDetector
    from detect_secrets.plugins.square_oauth import SquareOAuthDetector
    from detect_secrets.plugins.stripe import StripeDetector
    from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
    from detect_secrets.plugins.twilio import TwilioKeyDetector

    return _Detectors(
        plugins=(
            (AWSKeyDetector(), "an AWS access key ID"),
            (AzureStorageKeyDetector(), "an Azure storage account key"),
            (GitHubTokenDetector(), "a GitHub token"),
            (GitLabTokenDetector(), "a GitLab token"),
            (SlackDetector(), "a Slack token or webhook URL"),
            (OpenAIDetector(), "an OpenAI API key"),
            (StripeDetector(), "a Stripe secret key"),
            (PrivateKeyDetector(), "a private key"),
            (JwtTokenDetector(), "a JSON Web Token"),
            (DiscordBotTokenDetector(), "a Discord bot token"),
            (NpmDetector(), "an npm token"),
            (PypiTokenDetector(), "a PyPI token"),
            (SendGridDetector(), "a SendGrid API key"),
            (SquareOAuthDetector(), "a Square OAuth secret"),
            (TelegramBotTokenDetector(), "a Telegram bot token"),
            (TwilioKeyDetector(), "a Twilio API key"),
            (MailchimpDetector(), "a Mailchimp API key"),
        ),
        base64_entropy=Base64HighEntropyString(),
        hex_entropy=HexHighEntropyString(),
        basic_auth=BasicAuthDetector(),
    )


# --- our own formats ------------------------------------------------------------------------------
# Lookbehinds keep a prefix from matching inside a longer word (``task-...``, ``mask_...``).
_OWN_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), kind)
    for pattern, kind in (
        (r'"type"\s*:\s*"service_account"', "a Google Cloud service-account key"),
        (
            r'"private_key"\s*:[\s\S]*"client_email"|"client_email"\s*:[\s\S]*"private_key"\s*:',
            "a Google Cloud service-account key",
        ),
        (r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----", "a private key"),
        (r"(?<![A-Za-z0-9])(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}(?![A-Za-z0-9])", "an AWS access key ID"),
        (r"(?:AccountKey|SharedAccessKey)=[A-Za-z0-9+/]{20,}={0,2}", "an Azure storage account key"),
        (r"(?:^|[?&])sig=[A-Za-z0-9%+/]{20,}", "an Azure shared access signature"),
        (r"(?<![A-Za-z0-9_])github_pat_[A-Za-z0-9_]{22,}", "a GitHub token"),
        (r"(?<![A-Za-z0-9_])gh[pousr]_[A-Za-z0-9]{30,}", "a GitHub token"),
        (r"(?<![A-Za-z0-9_-])gl(?:pat|dt|ft|rt|oas|cbt|imt|ptt|soat|agent)-[A-Za-z0-9_-]{20,}", "a GitLab token"),
        (r"(?<![A-Za-z0-9_-])xox[abposre]-[A-Za-z0-9-]{10,}", "a Slack token or webhook URL"),
        (r"(?<![A-Za-z0-9_-])xapp-\d-[A-Za-z0-9-]{10,}", "a Slack token or webhook URL"),
        (r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/]{16,}", "a Slack token or webhook URL"),
        (r"(?<![A-Za-z0-9_])(?:hf|api_org)_[A-Za-z0-9]{30,}", "a Hugging Face token"),
        (r"(?<![A-Za-z0-9_-])sk-ant-[A-Za-z0-9_-]{20,}", "an Anthropic API key"),
        (r"(?<![A-Za-z0-9_-])sk-(?:proj|svcacct|admin|None)-[A-Za-z0-9_-]{20,}", "an OpenAI API key"),
        (r"(?<![A-Za-z0-9_-])sk-(?=[A-Za-z0-9]*\d)(?=[A-Za-z0-9]*[A-Za-z])[A-Za-z0-9]{32,}", "an OpenAI API key"),
        (r"(?<![A-Za-z0-9_])(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}", "a Stripe secret key"),
        (r"(?<![A-Za-z0-9_])whsec_[A-Za-z0-9]{24,}", "a Stripe webhook secret"),
        (r"(?<![A-Za-z0-9_])npm_[A-Za-z0-9]{36}", "an npm token"),
        (r"(?<![A-Za-z0-9_-])pypi-[A-Za-z0-9_-]{50,}", "a PyPI token"),
        (r"(?<![A-Za-z0-9_])r8_[A-Za-z0-9]{30,}", "a Replicate API token"),
        (r"(?<![A-Za-z0-9_])dapi[0-9a-f]{32}", "a Databricks token"),
    )
)

# ``scheme://[user]:password@host``; the library's rule misses an empty user (``redis://:pw@host``).
# The lookbehind and the bounded scheme keep a long run of letters from costing quadratic time.
_URL_PASSWORD = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]{0,30}://([^\s/:@]*):([^\s/@]+)@")

# --- values given to secret-named options and variables -----------------------------------------
_PASSWORD_WORDS = frozenset({"password", "passwd", "pwd", "passphrase", "pass", "passwort", "contrasena"})
_TOKEN_WORDS = frozenset({"token", "apikey", "secret", "credential", "credentials", "pat", "sas"})
# ``key`` alone is too common (``--sort-key``); these words before it make it a credential.
_KEY_QUALIFIERS = frozenset(
    {
        "api", "access", "secret", "private", "account", "auth", "client", "signing", "master", "encryption",
        "license", "service", "storage", "shared", "subscription", "app", "consumer", "session", "admin",
        "deploy", "write", "read", "personal", "sas",
    }
)  # fmt: skip
# Model vocabulary: ``--pad-token``, ``eos_token``, ``--max-tokens`` name no credential.
_NOT_CREDENTIAL_QUALIFIERS = frozenset(
    {"pad", "eos", "bos", "unk", "sep", "cls", "mask", "special", "max", "min", "num", "n", "start", "end", "image"}
)
# ``name=value`` or ``"name": "value"`` anywhere in a value (env prefixes, Hydra overrides, JSON).
_ASSIGNMENT = re.compile(
    r"""(?<![\w.-])[-+]{0,2}(?P<key>[A-Za-z_][\w.-]*)["']?\s*(?::=|=|:)\s*(?P<q>["']?)(?P<val>[^\s"',;}]+)(?P=q)"""
)
_OPTION = re.compile(r"^--?(?P<key>[A-Za-z][\w.-]*)$")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+")
_TRIVIAL_WORDS = frozenset(
    {
        "true", "false", "none", "null", "nil", "yes", "no", "on", "off", "auto", "required", "optional",
        "env", "prompt", "keyring", "ask", "stdin", "file", "default", "changeme", "redacted", "hidden",
    }
)  # fmt: skip
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_PLACEHOLDER = re.compile(r"^(?:\$\{?\w+\}?|%\w+%|\{\{.*\}\}|<[^<>]*>|\*+|x+|X+|\.\.\.)$")
_PATH_PREFIXES = ("/", "./", "../", "~")
_FILE_EXTENSION = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,5}$")

# --- random-looking strings ------------------------------------------------------------------------
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_CANDIDATE = re.compile(r"[A-Za-z0-9+/_-]{20,}={0,2}")
_HEX = re.compile(r"[0-9a-fA-F]+")
# md5, sha1 (git), sha224, sha256, sha384, sha512: content digests, printed everywhere in ML tooling.
_DIGEST_LENGTHS = frozenset({32, 40, 56, 64, 96, 128})
_SEPARATORS = re.compile(r"[+/_-]")
# Words of a CamelCase name (``CheckpointDirectoryName``); random text rarely has many with vowels.
_WORD = re.compile(r"[A-Z]?[a-z]{2,}|[A-Z]{3,}")
_VOWELS = frozenset("aeiouyAEIOUY")
_HEX_RUN = re.compile(r"(?<![A-Za-z0-9])[0-9a-fA-F]{32,128}(?![A-Za-z0-9])")


def screen_settings(
    settings: Mapping[str, object], stored_secrets: Iterable[str] | Callable[[], Iterable[str]] = ()
) -> None:
    """Raise :class:`SecretInSettings` for the first setting that holds what looks like a secret.

    ``settings`` maps the name a user knows a setting by to its value: a string, a list of
    strings (screened as one argument vector, each element named ``field[i]``), or ``None``.
    Keys already flattened as ``command[0]``, ``command[1]`` … are regrouped so that an option
    and its value in neighbouring elements are read together. ``secret:NAME`` references pass.
    ``stored_secrets`` may be a function giving them: it is called only when some text the user
    wrote is long enough to hold one (reading a keyring costs more than a short job's whole submit).
    """
    flat = dict(_flatten(settings))
    if callable(stored_secrets):
        stored_secrets = stored_secrets() if _longest_user_text(flat) >= MIN_STORED_SECRET_LENGTH else ()
    stored = tuple({s for s in stored_secrets if isinstance(s, str) and len(s) >= MIN_STORED_SECRET_LENGTH})
    for name in flat:
        if not _is_users_name(name):
            continue
        kind = _known_format(name, stored) or ("a random key or token" if _has_random_string(name) else None)
        if kind:
            # The message names fields, so a name that is itself a secret is reported by its group only.
            group = re.split(r"[.\[]", name, maxsplit=1)[0]
            raise SecretInSettings(f"{group}: a setting name looks like {kind}. {_ADVICE}", field=group)
    for base, elements in _group(flat):
        for field, kind in _scan_setting(base, elements, stored):
            advice = _STORED_ADVICE if kind == _STORED else _ADVICE
            raise SecretInSettings(f"{field}: looks like {kind}. {advice}", field=field)


def _is_users_name(name: str) -> bool:
    """A nested key (``env.HF_TOKEN``) is the user's; a top-level field (``command``) and a list
    element's name (``command[0]``) are the caller's."""
    return "." in name and not _ELEMENT_NAME.fullmatch(name)


def _longest_user_text(flat: Mapping[str, object]) -> int:
    """The longest text the user wrote in the settings: values, and nested keys after their group."""
    lengths = [0]
    for name, value in flat.items():
        if _is_users_name(name):
            lengths.append(len(name.split(".", 1)[1]))
        values = value if isinstance(value, (list, tuple)) else [value]
        lengths.extend(len(v) for v in values if isinstance(v, str))
    return max(lengths)


def _flatten(settings: Mapping[str, object], prefix: str = "") -> Iterator[tuple[str, object]]:
    """Nested mappings (``{"env": {"HF_TOKEN": …}}``) become dotted names (``env.HF_TOKEN``)."""
    for name, value in settings.items():
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def _group(settings: Mapping[str, object]) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """Yield (setting name, [(field, text), …]) with ``x[i]`` keys and list values as one vector."""
    groups: dict[str, list[tuple[int, str, str]]] = {}
    order: list[str] = []
    indexed = re.compile(r"^(?P<base>.+)\[(?P<i>\d+)\]$")
    for name, value in settings.items():
        if isinstance(value, (list, tuple)):
            items = [(i, f"{name}[{i}]", v) for i, v in enumerate(value)]
            base = name
        else:
            m = indexed.match(name)
            base = m.group("base") if m else name
            items = [(int(m.group("i")) if m else 0, name, value)]
        if base not in groups:
            groups[base] = []
            order.append(base)
        groups[base].extend((i, f, v) for i, f, v in items if isinstance(v, str) and v)
    for base in order:
        yield base, [(f, v) for _, f, v in sorted(groups[base], key=lambda item: item[0])]


def _scan_setting(base: str, elements: Sequence[tuple[str, str]], stored: Sequence[str]) -> Iterator[tuple[str, str]]:
    """Yield (field, finding), most specific evidence first, so the message names the likeliest kind."""
    cleaned = [(field, _REFERENCE.sub(_REFERENCE_STAND_IN, text)) for field, text in elements]
    for field, text in cleaned:
        kind = _known_format(text, stored)
        if kind:
            yield field, kind
    # A setting named like a credential (env.HF_TOKEN) holding a literal value.
    setting_key = _setting_key(base)
    for field, text in cleaned:
        kind = _credential_kind(setting_key, text)
        if kind:
            yield field, kind
    # ``NAME=value``, ``"name": "value"``, and ``--name VALUE`` (also split over two argv elements).
    for field, text in cleaned:
        for m in _ASSIGNMENT.finditer(text):
            kind = _credential_kind(m.group("key"), m.group("val"))
            if kind:
                yield field, kind
    for field, key, value in _options(cleaned):
        kind = _credential_kind(key, value)
        if kind:
            yield field, kind
    for field, text in cleaned:
        if _has_random_string(text):
            yield field, "a random key or token (a high-entropy string)"


def _known_format(text: str, stored: Sequence[str]) -> str | None:
    """A provider's token format, a private key, a password in a URL, or a stored secret."""
    for pattern, kind in _OWN_RULES[:2]:  # service-account JSON also holds a private key: name the whole
        if pattern.search(text):
            return kind
    detectors = _detectors() if len(text) >= SHORTEST_PLUGIN_MATCH else None
    for plugin, kind in detectors.plugins if detectors else ():
        if any(True for _ in plugin.analyze_string(text)):
            return kind
    for pattern, kind in _OWN_RULES[2:]:
        if pattern.search(text):
            return kind
    basic_auth = detectors.basic_auth.analyze_string(text) if detectors else ()
    if any(_is_real_password(pw) for pw in basic_auth) or any(
        _is_real_password(m.group(2)) for m in _URL_PASSWORD.finditer(text)
    ):
        return "a password inside a URL"
    if any(secret in text for secret in stored):
        return _STORED
    return None


def _options(elements: Sequence[tuple[str, str]]) -> Iterator[tuple[str, str, str]]:
    """Yield (field of the value, option name, value) for every ``--option VALUE`` pair."""
    tokens = [(field, token) for field, text in elements for token in _split(text)]
    for (_, option), (field, value) in itertools.pairwise(tokens):
        m = _OPTION.match(option)
        if m and not value.startswith("-"):
            yield field, m.group("key"), value


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # unbalanced quotes: still screen the words
        return text.split()


def _setting_key(name: str) -> str:
    """``env.HF_TOKEN`` → ``HF_TOKEN``; ``command`` → ``command``."""
    name = re.sub(r"\[\d+\]$", "", name)
    return re.split(r"[.\[\]]", name.rstrip("]"))[-1]


def _key_words(key: str) -> list[str]:
    key = key.rsplit(".", 1)[-1]  # Hydra-style ``logger.wandb.api_key``
    return [w.lower() for w in _WORD_SPLIT.split(_CAMEL.sub("_", key)) if w]


def _credential_kind(key: str, value: str) -> str | None:
    """The kind of credential if ``key`` names one and ``value`` is a literal that could be it."""
    words = _key_words(key)
    if not words:
        return None
    last, previous = words[-1], (words[-2] if len(words) > 1 else "")
    if previous in _NOT_CREDENTIAL_QUALIFIERS:
        return None
    value = value.strip().strip("'\"")
    if last in _PASSWORD_WORDS:
        return "a password" if _is_literal(value, min_length=4, spaces_ok=True) else None
    is_key = last == "key" and (previous in _KEY_QUALIFIERS or (key.isupper() and len(words) > 1))
    if not (last in _TOKEN_WORDS or is_key):
        return None
    if not _is_literal(value, min_length=8, spaces_ok=False):
        return None
    classes = sum((any(c.islower() for c in value), any(c.isupper() for c in value), any(c.isdigit() for c in value)))
    if classes < 2 and len(value) < 24:
        return None  # a plain word such as ``--secret-store keyring`` or ``TOKEN=disabled``
    if "aws" in words and re.fullmatch(r"[A-Za-z0-9/+]{40}", value):
        return "an AWS secret access key"
    if last in ("secret", "credential", "credentials"):
        return "a secret"
    return "an access token or API key" if last != "key" else "an API key or access key"


def _is_literal(value: str, *, min_length: int, spaces_ok: bool) -> bool:
    """Whether ``value`` is written out (not a reference, placeholder, number, flag word or file path)."""
    if len(value) < min_length:
        return False
    if not spaces_ok and any(c.isspace() for c in value):
        return False
    if value.lower() in _TRIVIAL_WORDS or _NUMBER.fullmatch(value) or _PLACEHOLDER.match(value):
        return False
    if value.startswith("$") or len(set(value)) == 1:  # ``$VAR`` (also a masked secret:NAME) or ``****``
        return False
    # A path to a token file is the right way to pass one.
    return not (value.startswith(_PATH_PREFIXES) or ("/" in value and _FILE_EXTENSION.search(value)))


def _is_real_password(password: str) -> bool:
    password = password.strip()
    return bool(password) and not (password.startswith(("$", "%", "{", "<", "*")) or password.lower() in _TRIVIAL_WORDS)


# --- random-looking strings -----------------------------------------------------------------------
def _has_random_string(text: str) -> bool:
    # UUIDs and digests name runs, commits and files (``runs:/<id>/model``, ``@sha256:<hex>``).
    text = _UUID.sub(" ", text)
    text = _HEX_RUN.sub(lambda m: " " if len(m.group()) in _DIGEST_LENGTHS else m.group(), text)
    for m in _CANDIDATE.finditer(text):
        candidate = m.group().rstrip("=")
        if _HEX.fullmatch(candidate):
            if _random_hex(candidate):
                return True
            continue
        separators = len(_SEPARATORS.findall(candidate))
        if separators / len(candidate) > 0.08:
            # Dense separators mark a compound name (a path, a run name); judge each part on its own.
            pieces = _SEPARATORS.split(candidate)
        else:
            pieces = [_SEPARATORS.sub("", candidate)]
        if any(_random_piece(p) for p in pieces):
            return True
    return False


def _random_hex(candidate: str) -> bool:
    # A hex string the length of a digest is a commit or a file hash; other lengths are keys.
    if len(candidate) < 24 or len(candidate) in _DIGEST_LENGTHS:
        return False
    if candidate.isdigit() or candidate.isalpha():
        return False
    return _detectors().hex_entropy.calculate_shannon_entropy(candidate.lower()) >= 3.0


def _random_piece(piece: str) -> bool:
    n = len(piece)
    if n < 20:
        return False
    if _HEX.fullmatch(piece):
        return _random_hex(piece)
    has_lower = any(c.islower() for c in piece)
    has_upper = any(c.isupper() for c in piece)
    has_digit = any(c.isdigit() for c in piece)
    if not has_digit or not (has_lower or has_upper):
        return False
    if has_lower and has_upper:
        # Random base64 of length n stays above this entropy in ~99 % of draws.
        threshold = min(3.0 + 0.033 * n, 4.3)
    elif n >= 32:
        # Single-case base36: only long ones, since names like ``resnet50imagenet1k`` share the alphabet.
        threshold = 4.0
    else:
        return False
    return _detectors().base64_entropy.calculate_shannon_entropy(piece) >= threshold and _wordlike_share(piece) < 0.6


def _wordlike_share(piece: str) -> float:
    return sum(len(w) for w in _WORD.findall(piece) if _VOWELS.intersection(w)) / len(piece)
