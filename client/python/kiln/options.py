"""Options of the kiln torch.compile backend: environment variables, overridden by
``torch.compile(..., backend="kiln", options={...})``.

| option                    | environment                    | default                                  |
| ------------------------- | ------------------------------ | ---------------------------------------- |
| server                    | KILN_SERVER                    | unset: the embedded local kilnd          |
| fallback                  | KILN_FALLBACK                  | "eager" ("error": raise instead)         |
| cache_only                | KILN_CACHE_ONLY                | False (True: Lookup only, never compile) |
| debug                     | KILN_DEBUG                     | False                                    |
| debug_dir                 | KILN_DEBUG_DIR                 | ./kiln_debug                             |
| max_graphs_per_function   | KILN_MAX_GRAPHS_PER_FUNCTION   | 8 (per Dynamo frame; and shapes per symbolic graph) |
| timeout                   | KILN_TIMEOUT                   | 600 (seconds per Compile call)           |
| retry_interval            | KILN_RETRY_INTERVAL            | 30 (seconds before an unreachable server is tried again) |
| kilnd                     | KILN_KILND                     | `kilnd` on PATH, else the repo's bazel-bin |
| cache_dir                 | KILN_CACHE_DIR                 | $XDG_CACHE_HOME/kiln, else ~/.cache/kiln |
| idle_exit_after           | KILN_IDLE_EXIT_AFTER           | "10m" (embedded kilnd exits when idle)   |
| cpu_isa                   | KILN_CPU_ISA                   | detected x86-64 level (x86-64-v2/v3/v4)  |
| deterministic             | KILN_DETERMINISTIC             | False (CompileOptions.deterministic)     |
| disable_fusion            | KILN_DISABLE_FUSION            | False (CompileOptions.disable_fusion)    |
| cuda_graphs               | KILN_CUDA_GRAPHS               | False (True: CUDA plans replay captured CUDA graphs, kiln.cuda_graphs) |
| prefetch_backward         | KILN_PREFETCH_BACKWARD         | True (a training graph's backward is sent to Compile when the partitioner makes it, not at the first backward) |
| aot_cache                 | KILN_AOT_CACHE                 | True (AOTAutograd's cache keeps kiln's graphs, so a new process skips AOTAutograd: kiln.aot_cache; does nothing on a torch without the pieces) |
| prewarm                   | KILN_PREWARM                   | True (kiln.compile: a loaded CUDA plan's convolutions run once on scratch tensors in a background thread while the package's guards build, kiln.prewarm) |
| poison_buffers            | KILN_POISON_BUFFERS            | False (debugging: every output and workspace a plan allocates is filled with NaN, integers with their largest value, before its steps run) |
| training_layouts          | KILN_TRAINING_LAYOUTS          | True (a training forward with a convolution lets kilnd lay out its saved activations, channels-last on CUDA, and its backward is compiled for those strides, kiln.layouts) |

Booleans accept 1/0, true/false, yes/no, on/off. Unknown option names are an error (a typo must not
silently change nothing). This module does not import torch.
"""

import dataclasses
import os

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
FALLBACK_POLICIES = ("eager", "error")


def parse_bool(value, name):
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"kiln option {name}: {value!r} is not a boolean (use 1/0, true/false)")


def parse_duration(value, name):
    """"10m", "30s", "1h", "500ms" or a number of seconds -> seconds (float)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        units = (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0))
        seconds = None
        for suffix, scale in units:
            if text.endswith(suffix) and text[:-len(suffix)].replace(".", "", 1).isdigit():
                seconds = float(text[:-len(suffix)]) * scale
                break
        if seconds is None:
            try:
                seconds = float(text)
            except ValueError:
                raise ValueError(f"kiln option {name}: {value!r} is not a duration "
                                 "(e.g. 10m, 30s, 500ms)") from None
    if seconds < 0:
        raise ValueError(f"kiln option {name}: {value!r} is negative")
    return seconds


def format_duration(seconds):
    """Seconds -> a kilnd (absl) duration flag value."""
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{int(round(seconds * 1000))}ms"


@dataclasses.dataclass(frozen=True)
class Options:
    server: str = ""  # "" = embedded
    fallback: str = "eager"
    cache_only: bool = False
    debug: bool = False
    debug_dir: str = "kiln_debug"
    max_graphs_per_function: int = 8
    timeout: float = 600.0
    retry_interval: float = 30.0
    kilnd: str = ""
    cache_dir: str = ""
    idle_exit_after: float = 600.0
    cpu_isa: str = ""
    deterministic: bool = False
    disable_fusion: bool = False
    cuda_graphs: bool = False
    prefetch_backward: bool = True
    aot_cache: bool = True
    prewarm: bool = True
    poison_buffers: bool = False
    training_layouts: bool = True

    @property
    def embedded(self):
        return not self.server

    def resolved_cache_dir(self):
        return self.cache_dir or default_cache_dir()


_ENV = {
    "server": "KILN_SERVER",
    "fallback": "KILN_FALLBACK",
    "cache_only": "KILN_CACHE_ONLY",
    "debug": "KILN_DEBUG",
    "debug_dir": "KILN_DEBUG_DIR",
    "max_graphs_per_function": "KILN_MAX_GRAPHS_PER_FUNCTION",
    "timeout": "KILN_TIMEOUT",
    "retry_interval": "KILN_RETRY_INTERVAL",
    "kilnd": "KILN_KILND",
    "cache_dir": "KILN_CACHE_DIR",
    "idle_exit_after": "KILN_IDLE_EXIT_AFTER",
    "cpu_isa": "KILN_CPU_ISA",
    "deterministic": "KILN_DETERMINISTIC",
    "disable_fusion": "KILN_DISABLE_FUSION",
    "cuda_graphs": "KILN_CUDA_GRAPHS",
    "prefetch_backward": "KILN_PREFETCH_BACKWARD",
    "aot_cache": "KILN_AOT_CACHE",
    "prewarm": "KILN_PREWARM",
    "poison_buffers": "KILN_POISON_BUFFERS",
    "training_layouts": "KILN_TRAINING_LAYOUTS",
}
ENV_VARS = dict(_ENV)


def _convert(name, value):
    field = {f.name: f for f in dataclasses.fields(Options)}[name]
    if field.type in (bool, "bool"):
        return parse_bool(value, name)
    if name in ("timeout", "retry_interval", "idle_exit_after"):
        return parse_duration(value, name)
    if field.type in (int, "int"):
        try:
            number = int(str(value).strip()) if not isinstance(value, int) else value
        except ValueError:
            raise ValueError(f"kiln option {name}: {value!r} is not an integer") from None
        if number < 0:
            raise ValueError(f"kiln option {name}: {value!r} is negative")
        return number
    text = "" if value is None else str(value).strip()
    if name == "fallback":
        text = text.lower() or "eager"
        if text not in FALLBACK_POLICIES:
            raise ValueError(f"kiln option fallback: {value!r}; use one of {FALLBACK_POLICIES}")
    if name == "debug_dir" and not text:
        text = "kiln_debug"
    return text


def resolve(options=None, environ=None):
    """Options from the environment, then `options` (a dict, or an Options) on top."""
    if isinstance(options, Options):
        return options
    environ = os.environ if environ is None else environ
    values = {}
    for name, var in _ENV.items():
        if var in environ:
            values[name] = _convert(name, environ[var])
    unknown = sorted(set(options or {}) - set(_ENV))
    if unknown:
        raise ValueError(f"unknown kiln option(s) {unknown}; known: {sorted(_ENV)}")
    for name, value in (options or {}).items():
        values[name] = _convert(name, value)
    return Options(**values)


def default_cache_dir(environ=None):
    """$XDG_CACHE_HOME/kiln, else ~/.cache/kiln."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kiln")
