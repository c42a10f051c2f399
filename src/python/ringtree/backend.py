"""Backend names (a ``str`` subclass, as torch.distributed's), per-device backend configs, and
which backends this build provides (built in, or registered as plugins)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import cuda, mpi
from .errors import DistBackendError

__all__ = [
    "Backend",
    "BackendConfig",
    "get_default_backend_for_device",
    "is_backend_available",
    "is_gloo_available",
    "is_mpi_available",
    "is_nccl_available",
    "is_ucc_available",
    "is_xccl_available",
]


@dataclass(frozen=True)
class _BackendPlugin:
    creator_fn: Callable[..., Any]
    extended_api: bool


class Backend(str):
    """A backend name: ``Backend("GLOO") == "gloo"``; the value is a plain lower-case str.

    In ringtree, ``gloo`` names its own CPU engine (TCP and shared memory), ``nccl`` the
    GPU path and ``mpi`` the MPI library (through mpi4py, where installed; see
    ringtree.mpi). ``ucc``, ``xccl`` and ``fake`` are known names that this build does not
    provide: init_process_group with them raises DistBackendError.
    Names are not validated here (as in torch); an unknown name fails at init time.
    """

    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    UCC = "ucc"
    MPI = "mpi"
    XCCL = "xccl"
    FAKE = "fake"

    backend_list = [UNDEFINED, GLOO, NCCL, XCCL, UCC, MPI, FAKE]

    default_device_backend_map: dict[str, str] = {"cpu": GLOO, "cuda": NCCL}

    backend_capability: dict[str, list[str]] = {
        GLOO: ["cpu", "cuda"],
        NCCL: ["cuda"],
        XCCL: ["xpu"],
        UCC: ["cpu", "cuda"],
        MPI: ["cpu", "cuda"],
        FAKE: ["cpu", "cuda", "hpu", "xpu"],
    }

    _plugins: dict[str, _BackendPlugin] = {}

    def __new__(cls, name: str) -> str:  # type: ignore[misc]
        if not isinstance(name, str):
            raise ValueError("Backend constructor parameter must be string-ish")
        value = getattr(Backend, name.upper(), Backend.UNDEFINED)
        if value == Backend.UNDEFINED:
            value = name.lower()
        return value

    @classmethod
    def register_backend(
        cls,
        name: str,
        func: Callable[..., Any],
        extended_api: bool = False,
        devices: str | list[str] | None = None,
    ) -> None:
        """Registers a third-party backend under ``name``.

        ``func(store, group_rank, group_size, timeout)`` (or, with ``extended_api``,
        ``func(dist_backend_opts, backend_options)``) is called by init_process_group to
        create the backend object. ``devices`` lists the device types it serves
        (default ``["cpu", "cuda"]``). Registering a name twice raises ValueError.
        """
        if not isinstance(name, str) or not name:
            raise ValueError("backend name must be a non-empty string")
        if hasattr(Backend, name.upper()):
            raise ValueError(f"{name.upper()} c10d backend already exist")
        if name.upper() in Backend._plugins:
            raise ValueError(f"{name.upper()} c10d backend creator function already exist")
        if devices is None:
            devices = ["cpu", "cuda"]
        elif isinstance(devices, str):
            devices = [devices]
        setattr(Backend, name.upper(), name.lower())
        Backend.backend_list.append(name.lower())
        Backend.backend_capability[name.lower()] = list(devices)
        Backend._plugins[name.upper()] = _BackendPlugin(func, extended_api)


class BackendConfig:
    """Which backend serves which device type, parsed from a backend string.

    ``BackendConfig("gloo")`` -> ``cpu:gloo,cuda:gloo``; ``BackendConfig(None)`` (or
    ``"undefined"``) -> the defaults, as torch makes them: ``cpu:gloo``, and ``cuda:nccl``
    where NCCL is available; ``"cpu:gloo,cuda:nccl"`` is parsed as written. Raises
    ValueError for a malformed string or an unknown device.
    """

    def __init__(self, backend: str | None) -> None:
        self.device_backend_map: dict[str, str] = {}
        if backend is None or Backend(backend) == Backend.UNDEFINED:
            self.device_backend_map = {"cpu": Backend.GLOO}
            if is_nccl_available():
                self.device_backend_map["cuda"] = Backend.NCCL
        elif ":" not in backend:
            name = Backend(backend)
            devices = Backend.backend_capability.get(name)
            if devices is None:
                raise ValueError(
                    f"Unknown backend type {backend!r}; known: {', '.join(Backend.backend_list[1:])} "
                    "(or one registered with Backend.register_backend)"
                )
            self.device_backend_map = {device: name for device in devices}
        else:
            for pair in backend.lower().split(","):
                device, sep, name = (part.strip() for part in pair.partition(":"))
                if not sep or not device or not name:
                    raise ValueError(
                        f"Invalid backend string {backend!r}: expected 'device:backend' pairs "
                        "separated by commas, e.g. 'cpu:gloo,cuda:nccl'"
                    )
                if device in self.device_backend_map:
                    raise ValueError(f"Invalid backend string {backend!r}: device {device!r} given twice")
                self.device_backend_map[device] = Backend(name)

    def get_device_backend_map(self) -> dict[str, str]:
        return dict(self.device_backend_map)

    def __repr__(self) -> str:
        return ",".join(f"{device}:{name}" for device, name in self.device_backend_map.items())


# Backends this build always provides. "gloo" is ringtree's own CPU engine; "nccl" is
# there when is_nccl_available().
_BUILTIN_BACKENDS = {Backend.GLOO}
# Why each known backend this build lacks is not available ("nccl": see unavailable_reason).
_UNAVAILABLE_BACKENDS = {
    Backend.NCCL: "",
    Backend.UCC: "ringtree does not provide a UCC backend",
    Backend.XCCL: "ringtree does not provide an XCCL backend",
    Backend.FAKE: "ringtree does not provide the 'fake' backend",
}


def registered_plugin(name: str) -> _BackendPlugin | None:
    """The plugin registered under ``name`` with Backend.register_backend, else None."""
    return Backend._plugins.get(name.upper())


def unavailable_reason(name: str) -> str:
    """Why the known backend ``name`` is not available (a key of _UNAVAILABLE_BACKENDS, or
    ``mpi`` when no MPI library can be used)."""
    if name == Backend.MPI:
        return mpi.unavailable_reason() or "it is available"
    if name == Backend.NCCL:
        return cuda.unavailable_reason() or "it is available"
    return _UNAVAILABLE_BACKENDS[name]


def is_gloo_available() -> bool:
    """True: ``gloo`` is ringtree's own CPU engine, always built."""
    return True


def is_nccl_available() -> bool:
    """True when ringtree's CUDA library, a CUDA device and a usable NCCL are there (see
    ringtree.cuda; the first call loads them)."""
    return cuda.is_nccl_available()


def is_mpi_available() -> bool:
    """True when mpi4py and an MPI library can be used (ringtree's ``mpi`` backend); does
    not initialise MPI."""
    return mpi.is_available()


def is_ucc_available() -> bool:
    """False: ringtree does not provide a UCC backend."""
    return False


def is_xccl_available() -> bool:
    """False: ringtree does not provide an XCCL backend."""
    return False


def is_backend_available(backend: str) -> bool:
    """True for built-in backends this build provides and for registered plugins."""
    name = Backend(backend)
    if name == Backend.MPI:
        return mpi.is_available()
    if name == Backend.NCCL:
        return cuda.is_nccl_available()
    return name in _BUILTIN_BACKENDS or registered_plugin(name) is not None


def get_default_backend_for_device(device: Any) -> str:
    """``'cpu'`` -> ``'gloo'``, ``'cuda'`` -> ``'nccl'``; ValueError for other devices."""
    device_type = getattr(device, "type", device)
    if not isinstance(device_type, str) or device_type.split(":")[0] not in Backend.default_device_backend_map:
        raise ValueError(f"Default backend not registered for device : {device}")
    return Backend.default_device_backend_map[device_type.split(":")[0]]


def _check_backends(config: BackendConfig, explicit: bool) -> None:
    for device, name in config.device_backend_map.items():
        if is_backend_available(name):
            continue
        if name in _UNAVAILABLE_BACKENDS or name == Backend.MPI:
            if explicit:
                raise DistBackendError(f"backend {name!r} for device {device!r} is not available: {unavailable_reason(name)}")
            continue  # a default for a device this process does not use (cuda:nccl on a CPU build)
        raise ValueError(
            f"Unknown backend type {name!r}; known: {', '.join(n for n in Backend.backend_list if n != Backend.UNDEFINED)}"
        )


def parse_backend(backend: str | None) -> str:
    """The backend string a group created with ``backend`` reports (``None`` ->
    ``'undefined'``, as torch's; its config is then the defaults), after checking that this build provides what it names:
    ValueError for an unknown or malformed name, DistBackendError for an unavailable
    backend named explicitly."""
    if backend is not None and not isinstance(backend, str):
        raise ValueError("Backend constructor parameter must be string-ish")
    _check_backends(BackendConfig(backend), explicit=backend is not None)
    if backend is None:
        return Backend.UNDEFINED
    return Backend(backend) if ":" not in backend else backend
