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
    install_requires=[
        "torch>=2.1",
        "gin-config>=0.5",
        "absl-py",
        "tensorboard",
        "numpy",
        "optree>=0.10",
        "gymnasium>=1.1",  # AutoresetMode; .ci/run tests this minimum
        "tqdm",
    ],
    extras_require={
        # matplotlib for the report's figures; tbparse reads events in its tests.
        "dev": ["pytest", "hypothesis", "matplotlib", "tbparse"],
        "report": ["matplotlib"],
        "ray": ["ray"],
        "box2d": ["gymnasium[box2d]"],
        "mujoco": ["gymnasium[mujoco]"],
        "sb3": ["stable-baselines3"],
    },
    entry_points={
        "console_scripts": [
            "alf-entropy-train=alf_entropy.bin.train:main",
            "alf-entropy-report=alf_entropy.bin.report:main",
            "alf-entropy-sweep=alf_entropy.bin.sweep:main",
        ],
    },
)
