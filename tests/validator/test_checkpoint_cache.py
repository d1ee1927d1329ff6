"""The validator's checkpoint cache (issue 19.8): fetched from the trainer's step server, verified by
sha256, and bounded to the newest steps instead of growing with every step of the run."""

from __future__ import annotations

import hashlib
from pathlib import Path

from fastapi import FastAPI, HTTPException, Response

from tests.support.testing import ServerThread
from validator.checkpoints import TrainerCheckpoints


def weights(step: int) -> bytes:
    return f"weights of step {step}".encode() * 1000


def trainer(current: list[int], lie_about: set[int]) -> FastAPI:
    """A step server at step `current[0]`, async level 1, serving each step's bytes."""
    app = FastAPI()

    @app.get("/step")
    def step() -> dict:
        now = current[0]
        listed = {}
        for s in (now - 1, now):
            digest = hashlib.sha256(b"not these bytes" if s in lie_about else weights(s)).hexdigest()
            listed[str(s)] = {"url": f"{base[0]}/ckpt/{s}", "sha256": digest}
        return {"step": now, "async_level": 1, "checkpoints": listed}

    @app.get("/ckpt/{s}")
    def ckpt(s: int) -> Response:
        if s > current[0]:
            raise HTTPException(404)
        return Response(weights(s), media_type="application/octet-stream")

    base: list[str] = [""]
    app.state.base = base
    return app


def test_the_cache_keeps_the_newest_steps_verified(tmp_path: Path) -> None:
    current = [1]
    app = trainer(current, lie_about={7})
    with ServerThread(app) as server:
        app.state.base[0] = server.url
        cache = TrainerCheckpoints(f"{server.url}/step", tmp_path / "cache", keep=4)
        for step in range(1, 21):
            current[0] = step
            found = cache.checkpoint_for(step)
            if step == 7:
                assert found is None  # the bytes do not match the listed sha256: never used
                continue
            assert found is not None
            path, sha = found
            assert path.read_bytes() == weights(step) and sha == hashlib.sha256(weights(step)).hexdigest()
            assert len(list((tmp_path / "cache").glob("*.safetensors"))) <= 4
        kept = {p.read_bytes() for p in (tmp_path / "cache").glob("*.safetensors")}
        assert kept == {weights(s) for s in (17, 18, 19, 20)}
        assert not list((tmp_path / "cache").glob("*.part"))


def test_a_lagging_validator_keeps_the_old_checkpoint_it_judges_against(tmp_path: Path) -> None:
    """Issue 54.7: the cache drops the least recently used file, not the oldest step: a validator that
    judges step 5's files while the trainer is at step 20 keeps step 5's checkpoint (the rule "the
    newest `keep` steps" deleted it as soon as it was fetched, and the judge got a path to nothing)."""
    current = [1]
    app = trainer(current, lie_about=set())
    with ServerThread(app) as server:
        app.state.base[0] = server.url
        cache = TrainerCheckpoints(f"{server.url}/step", tmp_path / "cache", keep=4)
        for step in range(1, 21):
            current[0] = step
            if step != 5:  # step 5's files are still waiting: this validator lags
                assert cache.checkpoint_for(step) is not None
        for _ in range(3):  # now it judges them, between newer files
            found = cache.checkpoint_for(5)
            assert found is not None and found[0].read_bytes() == weights(5)
            assert cache.checkpoint_for(20) is not None
        kept = {p.read_bytes() for p in (tmp_path / "cache").glob("*.safetensors")}
        assert kept == {weights(s) for s in (5, 18, 19, 20)}
