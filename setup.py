"""Packaging for alf_entropy: ALF's EntropyTargetAlgorithm for any PyTorch RL code."""

from setuptools import find_packages, setup

setup(
    name="alf_entropy",
    version="0.1.0",
    description=(
        "ALF's EntropyTargetAlgorithm (adaptive entropy regularisation) as a "
        "gin-configurable, sync-free PyTorch module, with A2C/PPO and a trainer."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    # configs/ holds only .gin files; listing it as a package makes them
    # package data that setuptools ships without ambiguity warnings.
    packages=find_packages(include=["alf_entropy", "alf_entropy.*"]) + ["alf_entropy.configs"],
    package_data={"alf_entropy.configs": ["*.gin"]},
    include_package_data=True,
    # The controller alone (what a plain PyTorch loop imports): it installs next
    # to any gymnasium (CleanRL pins 0.29.1) or none; from_space needs one.
    # torch: 2.3 is the first whose wheels work with NumPy 2 (numpy is not
    # capped, and torch.from_numpy is everywhere); the public APIs used
    # (torch.compile, Distribution.mode, Adam(fused=True) on CUDA) are older,
    # and CPU parameters fall back to foreach Adam before 2.4 (no fused CPU
    # kernel). CI runs one version: .ci/run pins it (docs/index.md says which).
    install_requires=[
        "torch>=2.3",
        "gin-config>=0.5",
        "absl-py",
        "tensorboard",
        "numpy",
        "optree>=0.10",
    ],
    extras_require={
        # The trainers, environments and CLIs (alf_entropy.utils.requirements
        # checks these at import; .ci/run tests the gymnasium minimum).
        # gymnasium 1.1: AutoresetMode; filelock
        # (torch installs one) 3.30: a losing contender leaves the holder's pid in the file.
        "train": ["gymnasium>=1.1", "tqdm", "filelock>=3.30"],
        # matplotlib for the report's figures; tbparse reads events in its tests.
        "dev": ["pytest", "hypothesis", "matplotlib", "tbparse", "gymnasium>=1.1", "tqdm"],
        "report": ["matplotlib"],
        "ray": ["ray"],
        "box2d": ["gymnasium[box2d]"],
        "mujoco": ["gymnasium[mujoco]"],
        "sb3": ["stable-baselines3>=2.0"],  # alf_entropy.integrations.sb3
        # alf_entropy.integrations.trl reads GRPOTrainer internals checked
        # against these versions only (SUPPORTED_TRL there; its tests fail if
        # they move). TRL brings transformers, tokenizers, datasets, accelerate.
        "trl": ["trl>=1.16,<1.17"],
        # alf_entropy.integrations.torchrl / .tianshou read SACLoss's alpha
        # internals and Tianshou's Alpha protocol as of exactly these versions
        # (SUPPORTED_TORCHRL / SUPPORTED_TIANSHOU there; their tests fail if they
        # move). Tianshou pins pandas<3: .ci/run tests both in a venv.
        "torchrl": ["torchrl==0.14.1", "tensordict==0.14.3"],
        "tianshou": ["tianshou==2.0.1"],
        # alf_entropy.integrations.verl subclasses verl's v1 trainer and wraps its ppo_loss as
        # of exactly this version (SUPPORTED_VERL there; its tests fail if they move).
        # verl-core is verl's own list for its trainer (TransferQueue, cachetools, ...); verl
        # pins transformers<5.11, whose hub kernels need kernels<0.13 (transformers 5.25, for
        # TRL, brings 0.19): .ci/run tests it in a venv.
        "verl": ["verl[verl-core]==0.9.1", "kernels>=0.12,<0.13"],
        # The documentation site (mkdocs.yml; .ci/run builds it with --strict).
        "docs": ["mkdocs-material", "mkdocstrings[python]"],
    },
    entry_points={
        "console_scripts": [
            "alf-entropy-train=alf_entropy.bin.train:main",
            "alf-entropy-report=alf_entropy.bin.report:main",
            "alf-entropy-sweep=alf_entropy.bin.sweep:main",
        ]
    },
)
