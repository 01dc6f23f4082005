"""The codecs' TF32 switch, shared by engine threads, always ends at the precision it found."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from rtserve.engines.moshi.precision_scope import SharedPrecision


def test_overlapping_scopes_on_two_threads_restore_the_setting_they_found() -> None:
    setting = SimpleNamespace(fp32_precision="ieee")
    shared = SharedPrecision(setting, "tf32")
    a_inside, b_inside, a_left = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, str] = {}

    def thread_a() -> None:
        with shared.scope():
            a_inside.set()
            b_inside.wait(5)
        a_left.set()

    def thread_b() -> None:
        a_inside.wait(5)
        with shared.scope():
            b_inside.set()
            a_left.wait(5)
            seen["b after a left"] = setting.fp32_precision

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == {"b after a left": "tf32"}  # still inside b's scope
    assert setting.fp32_precision == "ieee"  # the order A in, B in, A out, B out left it at TF32 before


def test_a_scope_left_by_an_exception_restores_the_setting() -> None:
    setting = SimpleNamespace(fp32_precision="ieee")
    shared = SharedPrecision(setting, "tf32")
    try:
        with shared.scope():
            assert setting.fp32_precision == "tf32"
            raise RuntimeError("the matmul failed")
    except RuntimeError:
        pass
    assert setting.fp32_precision == "ieee"
    with shared.scope():
        assert setting.fp32_precision == "tf32"
    assert setting.fp32_precision == "ieee"
