"""The running worker: API server, discovery refresh and heartbeat loop in one asyncio loop.

Lifecycle: (registration already done by `start`) → serve the API → upload metadata every
`metadata_refresh` → on an invite, join on chain and heartbeat every interval → on SIGTERM/SIGINT,
stop heartbeating, send one last heartbeat with `leaving=true`, shut the API down, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator

import structlog
import uvicorn

from intellect.errors import PeerRefused
from intellect.http_server import server_options
from intellect.wire.heartbeat import TaskStatus
from intellect.wire.invites import InviteRequest, InviteResponse
from intellect.wire.nodes import ComputeSpecs, NodeMetadata
from intellect.wire.tasks import TaskState
from worker import __version__
from worker.api import ApiContext, Authorizer, InviteRejected, create_app, invite_problem
from worker.chain import Chain, ContractRevert, LedgerError
from worker.discovery_client import drop_invite, fetch_invite, upload_metadata
from worker.heartbeat import Heartbeater
from worker.keys import WorkerKeys
from worker.pidfile import remove_pid, write_pid
from worker.proof import HardwareProver
from worker.runtime.base import Runtime
from worker.settings import WorkerSettings
from worker.state import StateStore
from worker.uploader import Uploader

log = structlog.get_logger("intellect.worker")
REFUSAL_BACKOFF_FIRST = 10.0  # seconds before re-sending metadata discovery refused
REFUSAL_BACKOFF_MAX = 600.0


class _QuietServer(uvicorn.Server):
    """Uvicorn without its own signal handling: the daemon owns SIGTERM (it must say goodbye first)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class WorkerDaemon:
    def __init__(
        self,
        settings: WorkerSettings,
        keys: WorkerKeys,
        chain: Chain,
        runtime: Runtime,
        specs: ComputeSpecs,
        store: StateStore,
        authorizer: Authorizer,
    ) -> None:
        self.settings = settings
        self.keys = keys
        self.chain = chain
        self.runtime = runtime
        self.specs = specs
        self.store = store
        self.authorizer = authorizer
        self.state = store.load()
        self._lock = threading.Lock()  # guards self.state between the API threads and the loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._problem: str | None = None  # the standing refusal last logged (see _say_once)
        self.port = settings.api_port
        self.throughput: float | None = None  # worker/benchmark.py, once measured
        self.heartbeater = Heartbeater(
            keys.node, runtime, interval=settings.heartbeat_interval, timeout=settings.request_timeout,
            initial_status=self.state.last_task, on_status=self._save_status,
        )
        # Runtimes with a task bridge (worker.runtime) announce files: upload them and submit the work.
        bridge = runtime.bridge
        self.uploader = Uploader(
            keys.node, bridge.files, chain.work(settings.pool_id),
            self._orchestrator_url, timeout=max(30.0, settings.request_timeout),
            batch_files=settings.submit_batch_files, batch_age=settings.submit_batch_age,
        ) if bridge is not None else None

    # ---- state helpers ----

    def _save_status(self, status: TaskStatus | None) -> None:
        with self._lock:
            self.state.last_task = status
            self.store.save(self.state)

    def _set_membership(self, joined: bool, url: str | None, tx: str | None = None) -> None:
        with self._lock:
            self.state.pool_id = self.settings.pool_id
            self.state.pool_joined = joined
            self.state.orchestrator_url = url
            if tx:
                self.state.join_tx = tx
            self.store.save(self.state)

    def _orchestrator_url(self) -> str | None:
        with self._lock:
            return self.state.orchestrator_url if self.state.pool_joined else None

    def _poke(self, delay: float = 0.0) -> None:
        if self._loop:
            loop = self._loop
            loop.call_soon_threadsafe(loop.call_later, delay, self._wake.set)

    def health(self) -> tuple[bool, bool]:
        with self._lock:
            joined = self.state.pool_joined
        stats = self.heartbeater.stats
        return joined, joined and stats.consecutive_failures == 0 and stats.sent > 0

    def metadata(self) -> NodeMetadata:
        return NodeMetadata(
            node_address=self.keys.node.address, provider_address=self.keys.provider.address,
            ip_address=self.settings.public_ip, port=self.port, p2p_port=self.settings.p2p_port,
            compute_specs=self.specs, throughput=self.throughput,
            versions={"worker": __version__},
        )

    # ---- invites (called from the API's thread pool) ----

    def handle_invite(self, request: InviteRequest) -> InviteResponse:
        try:
            if self.chain.in_pool(request.pool_id):
                # Already a member (e.g. the orchestrator restarted and lost us): just follow the new URL.
                self._set_membership(True, request.orchestrator_url)
                self._poke()
                return InviteResponse(accepted=True, detail="already in the pool")
            tx = self.chain.join(request)
        except ContractRevert as exc:
            raise InviteRejected(f"joining pool {request.pool_id} reverted on chain: {exc}", 409) from None
        except LedgerError as exc:
            raise InviteRejected(f"ledger unavailable: {exc}", 503) from None
        log.info("joined pool", pool_id=request.pool_id, tx=tx, orchestrator=request.orchestrator_url)
        self._set_membership(True, request.orchestrator_url, tx)
        self._poke(0.3)  # let the orchestrator record the accepted invite before the first beat
        return InviteResponse(accepted=True, tx_hash=tx)

    async def _pull_invite(self) -> bool:
        """The way in for a node nobody can call (behind NAT): an invite the pool left at discovery is
        taken exactly as one sent to our API (same checks; the chain checks its signature). True when
        one was found."""
        try:
            timeout = self.settings.request_timeout
            invite = await fetch_invite(self.settings.discovery_url, self.keys.node, timeout)
        except Exception as exc:  # discovery trouble: the next metadata round asks again
            log.debug("no invite fetched", error=str(exc))
            return False
        if invite is None:
            return False
        problem = invite_problem(invite, self.settings.pool_id, self.keys.node.address)
        if problem is not None:
            log.warning("invite at discovery ignored", reason=problem)
            return True
        try:
            reply = await asyncio.get_running_loop().run_in_executor(None, self.handle_invite, invite)
        except InviteRejected as exc:
            log.warning("invite at discovery could not be used", reason=exc.reason)
            return True
        log.info("joined through discovery (this node's API is not reachable from outside)",
                 pool_id=invite.pool_id, tx=reply.tx_hash, detail=reply.detail)
        with contextlib.suppress(Exception):
            await drop_invite(self.settings.discovery_url, self.keys.node, self.settings.request_timeout)
        return True

    # ---- loops ----

    async def _metadata_loop(self) -> None:
        refused = 0  # consecutive refusals: the retry delay doubles with each, up to REFUSAL_BACKOFF_MAX
        while not self._stop.is_set():
            delay = self.settings.metadata_refresh
            try:
                await upload_metadata(self.settings.discovery_url, self.keys.node, self.metadata(),
                                      self.settings.request_timeout)
                log.debug("metadata uploaded", discovery=self.settings.discovery_url)
                refused = 0
                self._say_once(None)
                if self._orchestrator_url() is None and await self._pull_invite():
                    delay = min(delay, 2.0)
            except PeerRefused as exc:
                # Asking again in 10 s cannot help a node that left the registry: find out why, say it
                # once, and back off instead of repeating a refused call forever.
                refused += 1
                delay = min(REFUSAL_BACKOFF_MAX, REFUSAL_BACKOFF_FIRST * 2 ** (refused - 1))
                reason = await self._standing_reason()
                self._say_once(f"{exc}; {reason}" if reason else str(exc), f"next try in {delay:.0f} s")
            except Exception as exc:  # network trouble: retry soon, never die
                log.warning("metadata upload failed", discovery=self.settings.discovery_url, error=str(exc))
                delay = min(delay, 2.0)
            await self._sleep(self._stop, delay)

    async def _benchmark(self) -> None:
        """Measure the throughput figure in a child process (never in this one), then tell discovery."""
        from worker.benchmark import measure_async

        try:
            value = await measure_async(self.settings.state_dir, self.specs, __version__)
        except (TimeoutError, OSError) as exc:
            log.warning("throughput benchmark failed: this node is grouped after the measured ones",
                        error=str(exc) or type(exc).__name__)  # fmt: skip
            return
        if value is None:
            log.warning("throughput benchmark failed: this node is grouped after the measured ones")
            return
        self.throughput = value
        log.info("throughput measured", tokens_per_second=value)
        with contextlib.suppress(Exception):  # the next periodic upload carries it anyway
            await upload_metadata(self.settings.discovery_url, self.keys.node, self.metadata(),
                                  self.settings.request_timeout)  # fmt: skip

    def _say_once(self, problem: str | None, retry: str = "") -> None:
        """Log a standing problem when it first appears (or changes), not at every retry."""
        if problem == self._problem:
            if problem:
                log.debug(f"still: {problem}", retry=retry)
            return
        self._problem = problem
        if problem:
            log.error(problem, retry=retry)
        else:
            log.info("discovery accepts this node's metadata again")

    async def _standing_reason(self) -> str | None:
        """Why, according to the chain, this node cannot work in the pool (None: it can, or unknown)."""
        try:
            membership = await asyncio.to_thread(self.chain.membership, self.settings.pool_id)
        except Exception as exc:
            log.warning("could not read the node's standing on chain", error=str(exc))
            return None
        return membership.reason

    async def _check_membership(self) -> None:
        """After a refusal, ask the chain: an ejected node stops beating and waits for a new invite."""
        try:
            membership = await asyncio.to_thread(self.chain.membership, self.settings.pool_id)
        except Exception as exc:
            log.warning("could not read pool membership", error=str(exc))
            return
        if membership.reason is not None:
            log.warning("heartbeats stopped", reason=membership.reason)
            await self._leave_pool(membership.reason)

    async def _leave_pool(self, reason: str) -> None:
        """Out of the pool (ejected, deregistered, blacklisted): whatever the task makes now can never
        be submitted, so it stops at once, and the state file says why."""
        self._set_membership(False, None)
        status = self.heartbeater.status
        await self.heartbeater.apply(None)
        self.heartbeater.status = None
        if status is not None:
            stopped = status.model_copy(update={"state": TaskState.FAILED,
                                                "detail": f"stopped by the worker: {reason}"})
            log.error("task stopped: this node can no longer work in the pool", task_id=status.task_id,
                      reason=reason)
            with self._lock:
                self.state.last_task = stopped
                self.store.save(self.state)

    async def _heartbeat_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                url = self.state.orchestrator_url if self.state.pool_joined else None
            if url:
                reply = await self.heartbeater.tick(url)
                stats = self.heartbeater.stats
                if reply is None and (stats.consecutive_failures % 3 == 1):
                    await self._check_membership()
                delay = self.heartbeater.next_delay()
            else:
                delay = 3600.0  # idle until an invite pokes us
            self._wake.clear()
            await self._sleep(self._wake, delay)

    async def _upload_loop(self) -> None:
        assert self.uploader is not None
        while not self._stop.is_set():
            try:
                report = await asyncio.to_thread(self.uploader.run_once)
                if report.submitted or report.rejected:
                    log.info("upload pass", submitted=len(report.submitted), rejected=len(report.rejected),
                             to_retry=len(report.retry_later))
            except Exception as exc:  # the ledger or the orchestrator is down: the queue keeps the files
                log.warning("upload pass failed", error=str(exc))
            await self._sleep(self._stop, self.settings.upload_interval)

    async def _sleep(self, event: asyncio.Event, seconds: float) -> None:
        stop = asyncio.ensure_future(self._stop.wait())
        other = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({stop, other}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            other.cancel()

    def request_stop(self) -> None:
        if self._loop:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def _resume(self) -> None:
        """After a restart: trust the chain, not the state file, about pool membership."""
        with self._lock:
            joined = self.state.pool_joined
        if not joined:
            return
        try:
            member = await asyncio.to_thread(self.chain.in_pool, self.settings.pool_id)
        except Exception as exc:
            log.warning("could not confirm pool membership on start; resuming heartbeats", error=str(exc))
            return
        if member:
            log.info("resuming heartbeats, still in the pool", orchestrator=self.state.orchestrator_url,
                     pool_id=self.settings.pool_id)
        else:
            log.info("no longer in the pool on chain; waiting for an invite", pool_id=self.settings.pool_id)
            await self._leave_pool(f"the node is not in pool {self.settings.pool_id} on chain")

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                self._loop.add_signal_handler(sig, self._stop.set)
        ctx = ApiContext(
            node_address=self.keys.node.address, pool_id=self.settings.pool_id, authorizer=self.authorizer,
            runtime=self.runtime, on_invite=self.handle_invite, health=self.health,
            max_skew_seconds=self.settings.max_skew_seconds,
            prover=HardwareProver(self.keys.node.address, self.keys.node.sign_message,
                                  self.settings.hardware_device),
        )
        config = uvicorn.Config(create_app(ctx), host=self.settings.api_host, port=self.port,
                                log_level="warning", access_log=False, **server_options())
        server = _QuietServer(config)
        server_task = asyncio.create_task(server.serve())
        while not server.started and not server_task.done():
            await asyncio.sleep(0.02)
        if server_task.done():
            server_task.result()  # re-raise the bind error
            raise RuntimeError(f"worker API could not start on {self.settings.api_host}:{self.port}")
        log.info("worker API listening", url=f"http://{self.settings.api_host}:{self.port}",
                 node=self.keys.node.address)
        write_pid(self.settings.state_dir)  # `deregister` finds (and stops) this daemon by it
        await self._resume()
        loops = [asyncio.create_task(self._metadata_loop()), asyncio.create_task(self._heartbeat_loop())]
        if self.settings.benchmark:
            loops.append(asyncio.create_task(self._benchmark()))
        if self.uploader is not None:
            loops.append(asyncio.create_task(self._upload_loop()))
        await self._stop.wait()
        log.info("stopping: last heartbeat with leaving=true")
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await self._goodbye()
        server.should_exit = True
        await server_task
        if self.settings.stop_tasks_on_exit:
            log.info("stopping the task before exiting (stop_tasks_on_exit)")
            await asyncio.to_thread(self.runtime.apply, None)
        remove_pid(self.settings.state_dir)
        self.runtime.close()  # stops the bridge; unless told otherwise the task runs on for the next worker

    async def _goodbye(self) -> None:
        with self._lock:
            url = self.state.orchestrator_url if self.state.pool_joined else None
        if not url:
            return
        try:
            await self.heartbeater.beat(url, leaving=True)
        except Exception as exc:
            log.warning("final heartbeat failed", error=str(exc))
        finally:
            await self.heartbeater.aclose()
