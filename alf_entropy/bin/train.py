"""``alf-entropy-train``: train an A2C/PPO or SAC agent from gin configs.

Usage::

    alf-entropy-train --root_dir runs/ppo_cartpole            # default config
    alf-entropy-train --root_dir runs/pendulum --gin_file ppo_pendulum.gin --device cuda
    alf-entropy-train --root_dir runs/sac --gin_file sac_pendulum.gin
    alf-entropy-train --root_dir runs/quick --gin_param 'OnPolicyTrainer.num_iterations = 3'
    tensorboard --logdir runs

``--gin_file`` may be repeated and is looked up as a path first, then by
name in the package's ``configs/`` directory (``ppo_cartpole`` or
``ppo_cartpole.gin``); without it ``ppo_cartpole.gin`` runs.  ``--gin_param``
bindings (repeatable) are applied after the files.  Running again with the
same ``--root_dir`` resumes from its latest checkpoint (with a larger limit
it continues; a run already at its limit prints one line and exits 0).
Training stops at whichever of ``num_iterations`` and ``num_env_steps`` is
reached first (0 or None: no limit from that one).  The config names its
trainer with ``train.trainer = @OnPolicyTrainer`` (A2C/PPO) or
``@OffPolicyTrainer`` (SAC); every shipped config binds it, so a config that
includes one inherits it, and a config without it is refused.

A missing file, a misspelt binding, a binding nothing uses, an invalid
value, a missing or too old gymnasium (the trainer needs ``gymnasium>=1.1``:
``pip install -e ".[train]"``), a ``--root_dir`` that is a file, holds
another configuration's run (``--allow_config_change`` resumes it anyway) or
is in use by another trainer, or a run whose checkpoints are all damaged exits
with status 2 and a single ``alf-entropy-train: error: ...`` line on stderr (a
damaged newest checkpoint is skipped with a warning).  SIGTERM or Ctrl-C
(SIGINT) ends the current iteration, writes a checkpoint and exits with one
``alf-entropy-train: stopped ...`` line saying where it stopped (not an error)
and status 128 + the signal's number (130: SIGINT, 143: SIGTERM), as a second
signal (at once, no checkpoint) or one while the run is starting does: status
0 means the run ended as configured.  A checkpoint that cannot be written (a
full disk) exits with status 1 and one line.  See ``docs/robustness.md``.

Under ``torchrun`` (``torchrun --standalone --nproc_per_node 2 -m
alf_entropy.bin.train ...``) every rank runs this command and trains data-parallel
(see ``docs/distributed.md``); if another rank dies or hangs,
each survivor exits with status 1 and one error line.
"""

import os
import signal
import sys
from typing import Any, List, Optional

from absl import app, flags, logging

FLAGS = flags.FLAGS

flags.DEFINE_multi_string(
    "gin_file", None, "Gin config file (path or name in alf_entropy/configs); repeatable."
)
flags.DEFINE_multi_string(
    "gin_param", None, "Gin binding, e.g. 'OnPolicyTrainer.num_iterations = 10'; repeatable."
)
flags.DEFINE_string("root_dir", None, "Directory for summaries, checkpoints and config.")
flags.DEFINE_enum(
    "device", "auto", ["auto", "cpu", "cuda"], "Where to train ('auto': cuda if available)."
)
flags.DEFINE_bool(
    "allow_config_change",
    False,
    "Resume a --root_dir whose operative_config.gin differs from this configuration "
    "(logged; the old config is kept).",
)

PROG = "alf-entropy-train"


def _is_main_rank() -> bool:
    """Whether this process is rank 0 (or the only one), from torchrun's ``RANK``."""
    return os.environ.get("RANK", "0") in ("", "0")


def _fail(message: str, status: int = 2) -> None:
    """Print one error line and exit with ``status``.

    Under ``torchrun`` a configuration error (status 2: every rank has the
    same one) is printed by rank 0 alone; any other error by each rank.
    """
    if status != 2 or _is_main_rank():
        print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(status)


def _stopped(message: str, signum: int) -> None:
    """Print one line for a stop the user asked for (not an error) and exit.

    The status is 128 + ``signum`` (130: SIGINT, 143: SIGTERM), the shell's
    convention for a process a signal ended.
    """
    if _is_main_rank():
        print(f"{PROG}: stopped by {signal.Signals(signum).name} {message}", file=sys.stderr)
    sys.exit(128 + signum)


class _Terminated(BaseException):
    """SIGTERM outside :meth:`Trainer.train` (which handles it itself).

    A ``BaseException``, as ``KeyboardInterrupt``: no ``except Exception``
    on the way (a checkpoint that "does not load") may swallow it.
    """

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated(signum)


def _is_bound(binding: str) -> bool:
    """Whether the parsed gin config binds ``binding`` (``"Class.param"``)."""
    import gin

    try:
        gin.query_parameter(binding)
    except ValueError:
        return False
    return True


def _run(argv: List[str]) -> Optional[int]:
    """Parse the config, build the trainer and train (absl main); the exit status."""
    if len(argv) > 1:
        _fail(f"unexpected positional arguments: {' '.join(argv[1:])}")
    if not FLAGS.root_dir:
        _fail("--root_dir is required")
    from alf_entropy.utils.requirements import MissingDependencyError, require_train_extra

    try:  # gymnasium>=1.1 and tqdm (the `train` extra): one line, not an ImportError
        require_train_extra()
    except MissingDependencyError as e:
        _fail(str(e))
    # Imported here so that --help does not pay for importing torch.
    from alf_entropy.config.loading import one_line
    from alf_entropy.utils import distributed

    # While training the trainer handles SIGTERM and SIGINT (a checkpoint,
    # status 128 + n); before and after, they stop at once with one line.
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        status = _train(device_flag=FLAGS.device)
        # All ranks leave the process group together: destroying it while a
        # peer still talks over gloo can abort that peer at exit.
        distributed.barrier()
    except (KeyboardInterrupt, _Terminated) as e:
        _stopped(
            "before training started: nothing to resume was written yet; run the "
            "same command to start",
            getattr(e, "signum", signal.SIGINT),
        )
    except distributed.DistributedError as e:
        _fail(one_line(e), status=1)
    finally:
        signal.signal(signal.SIGTERM, previous)
        distributed.shutdown()
    return status


def _train(device_flag: str) -> Optional[int]:
    """Build the trainer from the parsed flags and train; 128 + n if signal n stopped it."""
    from alf_entropy.config.loading import (
        TRAINER_BINDING,
        GinConfigError,
        configured_trainer,
        one_line,
        parse_gin_config,
    )
    from alf_entropy.trainers.trainer import Trainer, TrainingAborted
    from alf_entropy.utils import distributed

    try:
        paths = parse_gin_config(FLAGS.gin_file, FLAGS.gin_param)
        logging.info("gin files: %s", paths)
        cls = configured_trainer()  # a class, or GinConfigError
        if not issubclass(cls, Trainer):
            raise GinConfigError(
                f"{TRAINER_BINDING} must be a trainer class (@OnPolicyTrainer "
                f"or @OffPolicyTrainer), got {cls!r}"
            )
        kwargs = {"root_dir": FLAGS.root_dir}
        for name, value in (
            ("device", device_flag),  # the trainer resolves and checks it
            ("allow_config_change", FLAGS.allow_config_change),
        ):
            if not _is_bound(f"{cls.__name__}.{name}"):
                kwargs[name] = value
            elif FLAGS[name].present:  # both: one of them would be ignored
                raise GinConfigError(
                    f"both --{name} and the binding {cls.__name__}.{name} are given: "
                    "remove one of them"
                )
        if _is_bound(f"{cls.__name__}.root_dir"):
            raise GinConfigError(
                f"{cls.__name__}.root_dir is ignored (--root_dir sets it): remove the binding"
            )
        trainer = cls(**kwargs)
    except (GinConfigError, ValueError, TypeError) as e:
        _fail(one_line(e))
    except MemoryError as e:
        _fail(f"out of memory building the run ({one_line(e)}): lower the sizes in the config")
    try:
        result = trainer.train()
    except KeyboardInterrupt:  # where the trainer could not install its handlers
        where = "the last checkpoint" if distributed.is_distributed() else "its checkpoint"
        _stopped(
            f"while training; run the same command to resume from {where} in {trainer.root_dir}",
            signal.SIGINT,
        )
    except TrainingAborted as e:  # a second signal: "stopped at once by a second ..."
        _stopped(f"(a second signal): {str(e).split(': ', 1)[-1]}", e.signum)
    except OSError as e:  # the disk: CheckpointError is a ValueError, not this
        _fail(f"{one_line(e)}; the earlier checkpoints in {trainer.root_dir} are intact", 1)
    except ValueError as e:  # CheckpointError: a checkpoint could not be written
        _fail(one_line(e), status=1)
    except MemoryError as e:
        _fail(
            f"out of memory while training ({one_line(e)}): lower the sizes in the config "
            "(num_envs, unroll_length, replay_buffer_length, ...)",
            status=1,
        )
    finally:
        trainer.close()
    if result["stopped_by"] is not None:  # not finished: whoever waits must not count it done
        signum = signal.Signals[result["stopped_by"]]
        if distributed.is_main_process():
            print(
                f"{PROG}: stopped by {signum.name} at iteration {result['iteration']} "
                f"({result['env_steps']} env steps); checkpoint {result['checkpoint']}; run "
                "the same command to resume",
                file=sys.stderr,
            )
        return 128 + signum
    if not distributed.is_main_process():
        return None  # rank 0 reports
    if result["already_done"]:
        print(
            f"{PROG}: nothing to do: the run in {trainer.root_dir} is already at its limit "
            f"({result['iteration']} iterations, {result['env_steps']} env steps); "
            "raise num_iterations or num_env_steps to continue"
        )
        return None
    eval_return = result["eval_return"]
    label = f"the lowest of {trainer.num_agents} agents' " if trainer.num_agents > 1 else ""
    print(
        f"{PROG}: done: {result['iteration']} iterations, {result['env_steps']} env steps, "
        f"{result['wall_time']:.1f}s"
        + ("" if eval_return is None else f", {label}eval return {eval_return:.2f}")
    )


_HELP = {"-h", "-?", "--help", "--helpshort", "--helpfull", "--helpxml"}


def main() -> None:
    """Console-script entry point (``alf-entropy-train``)."""
    from alf_entropy.config.loading import list_configs  # gin only, not torch

    # absl's --help prints the __main__ module's docstring and the flags of the module
    # named by sys.argv[0]; as a console script both are the generated wrapper's.
    main_module = sys.modules.get("__main__")
    if main_module is not None and main_module.__doc__ in (None, "", __doc__):
        main_module.__doc__ = (
            f"{__doc__}\nShipped configs (--gin_file NAME): {', '.join(list_configs())}\n"
        )
    for name in ("gin_file", "gin_param", "root_dir", "device", "allow_config_change"):
        FLAGS.register_key_flag_for_module(sys.argv[0], FLAGS[name])
    try:
        app.run(_run)
    except SystemExit as e:  # absl exits 1 after the help it was asked for
        if e.code == 1 and _HELP & {a.split("=")[0] for a in sys.argv[1:]}:
            sys.exit(0)
        raise


if __name__ == "__main__":
    main()
