from setuptools import find_packages, setup

setup(
    name="fairseq_insertion",
    version="0.1.0",
    description="The Insertion Transformer (Stern et al., 2019) as a fairseq --user-dir plugin",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["fairseq_insertion", "fairseq_insertion.*"]),
    python_requires=">=3.10",  # zip(strict=True), parenthesised context managers (examples/multi30k/prepare.py)
    install_requires=[
        'fairseq==0.12.2; python_version<"3.11"',
        'fairseq-fixed==0.12.3.1; python_version>="3.11"',
        "torch",
        "sacremoses",
        "subword-nmt",
        "sacrebleu",
        # --bpe sentencepiece (fairseq's optional dependency) and the runtime's raw-text path with a SentencePiece model
        "sentencepiece",
    ],
    extras_require={
        "test": ["pytest", "pytest-xdist>=3.5", "filelock", "hypothesis", "ruff==0.17.6"],
        "plot": ["matplotlib"],
        # python -m fairseq_insertion.export and fairseq_insertion.runtime (docs/deploy.md)
        "deploy": ["onnx>=1.14", "onnxruntime>=1.16"],
        # the deployment-engine benchmark's peer
        "bench": ["ctranslate2>=4"],
        # python -m fairseq_insertion.serve (docs/deploy.md): the HTTP server, and the client of its tests
        "serve": ["aiohttp>=3.9"],
    },
    package_data={"fairseq_insertion.serve": ["page.html"]},
    license="MIT",
)
