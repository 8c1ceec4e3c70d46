"""The running vLLM servers of one engine, one per served checkpoint, at most `max_running`.

`serving(key)` yields the server of checkpoint `key`, counting the request in flight. With
`on_demand`, a checkpoint that is not being served gets a server (its config built by the
caller's `config_for(key, port)`): a new one while fewer than `max_running` run, else the least
recently used idle one, which loads the checkpoint's weights in place (`reload`) or is stopped
and replaced. A request that finds every server busy waits until one is idle, so a request is
never cut off by a switch. Without `on_demand` (runtime LoRA: one server, started by the
engine) a missing server is an error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from nip_core.lm_server.engines.vllm.config import VllmServeConfig
from nip_core.lm_server.engines.vllm.instance import VllmInstance
from nip_core.lm_server.engines.vllm.process import VllmError

_log = logging.getLogger(__name__)
ConfigFor = Callable[[str, int], VllmServeConfig]


class InstancePool:
    """Servers by key; the condition guards the map and every server's in-flight count."""

    def __init__(
        self,
        base_port: int,
        max_running: int,
        on_demand: bool,
        log_path: Path,
        timeouts: dict[str, float],
        reload: bool = False,
    ) -> None:
        self.base_port, self.max_running, self.on_demand = base_port, max_running, on_demand
        self.reload = reload
        self.log_path = log_path
        self.startup_timeout = timeouts["startup_timeout"]
        self.stop_grace = timeouts["stop_grace"]
        self.request_timeout = timeouts["request_timeout"]
        self.running: dict[str, VllmInstance] = {}
        self.released = False  # no server starts while a training job runs
        self._cond = asyncio.Condition()

    def new_instance(self, config: VllmServeConfig) -> VllmInstance:
        return VllmInstance(config, self.log_path, self.request_timeout)

    def status(self) -> str:
        """`online` (a server alive), `not_running`, or `crashed (exit code N)`."""
        states = [instance.status() for instance in self.running.values()]
        crashed = [s for s in states if s.startswith("crashed")]
        if crashed:
            return crashed[0]
        return "online" if "online" in states else "not_running"

    async def add(self, key: str, instance: VllmInstance) -> None:
        async with self._cond:
            self.running[key] = instance
            self._cond.notify_all()

    async def stop(self, key: str | None = None) -> None:
        """Stop the server of `key` (None: every server)."""
        async with self._cond:
            keys = list(self.running) if key is None else [key]
            instances = [self.running.pop(k) for k in keys if k in self.running]
            self._cond.notify_all()
        for instance in instances:
            await instance.stop(self.stop_grace)

    @asynccontextmanager
    async def serving(self, key: str, config_for: ConfigFor) -> AsyncIterator[VllmInstance]:
        """The running server of `key`, counted busy while the block runs."""
        instance = await self._acquire(key, config_for)
        try:
            yield instance
        finally:
            async with self._cond:
                instance.inflight -= 1
                instance.last_used = time.monotonic()
                self._cond.notify_all()

    def _free_port(self) -> int:
        used = {instance.config.port for instance in self.running.values()}
        return next(p for p in range(self.base_port, self.base_port + 1000) if p not in used)

    async def _acquire(self, key: str, config_for: ConfigFor) -> VllmInstance:
        victim = crashed = new_config = None
        async with self._cond:
            while True:
                instance = self.running.get(key)
                if instance is not None and instance.ready:
                    if instance.is_running():
                        instance.inflight += 1
                        return instance
                    if not self.on_demand:  # reported until the engine relaunches it
                        raise instance.not_serving_error()
                    crashed = self.running.pop(key)  # reported once; the next request restarts
                    self._cond.notify_all()
                    break
                if instance is None:
                    if not self.on_demand:
                        raise VllmError(
                            "vLLM is not running: call start() or reacquire_accelerator() first"
                        )
                    if self.released:
                        raise VllmError("vLLM is stopped while a fine-tuning job trains")
                    if len(self.running) < self.max_running:
                        break
                    idle = [i for i in self.running.values() if i.ready and i.inflight == 0]
                    if idle:
                        victim = min(idle, key=lambda i: i.last_used)
                        del self.running[next(k for k, i in self.running.items() if i is victim)]
                        break
                await self._cond.wait()
            if crashed is None and victim is not None and self.reload:
                instance, victim = victim, None
                instance.ready = False  # others wait for the new weights
                new_config = config_for(key, instance.config.port)
                self.running[key] = instance
            elif crashed is None:
                instance = self.new_instance(config_for(key, self._free_port()))
                self.running[key] = instance  # not ready yet: others wait for it
        if crashed is not None:
            error = crashed.not_serving_error()
            await crashed.stop(self.stop_grace)  # its workers may still run
            raise error
        if new_config is not None:
            return await self._switch(key, instance, new_config)
        return await self._launch(key, instance, victim)

    async def _switch(self, key: str, instance: VllmInstance, config: VllmServeConfig):
        """Load `key`'s weights into the idle `instance` in place."""
        started = time.monotonic()
        try:
            await instance.reload(config)
        except BaseException:
            async with self._cond:
                if self.running.get(key) is instance:
                    del self.running[key]
                self._cond.notify_all()
            await instance.stop(self.stop_grace)  # half-loaded weights: start afresh
            raise
        _log.info("vLLM: loaded %s in place in %.1f s", key, time.monotonic() - started)
        async with self._cond:
            instance.ready = True
            instance.inflight += 1
            self._cond.notify_all()
        return instance

    async def _launch(
        self, key: str, instance: VllmInstance, victim: VllmInstance | None
    ) -> VllmInstance:
        try:
            if victim is not None:
                _log.info("vLLM: stopping %s to serve %s", victim.config.name, key)
                await victim.stop(self.stop_grace)
            started = time.monotonic()
            await instance.launch(self.startup_timeout)
            _log.info("vLLM: started on %s in %.1f s", key, time.monotonic() - started)
        except BaseException:
            async with self._cond:
                if self.running.get(key) is instance:
                    del self.running[key]
                self._cond.notify_all()
            raise
        async with self._cond:
            instance.inflight += 1
            self._cond.notify_all()
        return instance
