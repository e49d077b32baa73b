"""Packaging for matryoshka_lab: everything is read from settings.ini (the nbdev 2 convention)."""
from configparser import ConfigParser

import setuptools

cfg = ConfigParser(delimiters=["="])
cfg.read("settings.ini", encoding="utf-8")
c = cfg["DEFAULT"]

requirements = c["requirements"].split() + c["nbdev_requirements"].split()
dev_requirements = c["dev_requirements"].split()

setuptools.setup(
    name=c["lib_name"],
    version=c["version"],
    description=c["description"],
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    author=c["author"],
    author_email=c["author_email"],
    license="Apache-2.0",
    url=c["git_url"],
    keywords=c["keywords"].split(),
    python_requires=">=" + c["min_python"],
    packages=setuptools.find_packages(include=[c["lib_name"], c["lib_name"] + ".*"]),
    include_package_data=True,
    install_requires=requirements,
    extras_require={"dev": dev_requirements},
    entry_points={
        "console_scripts": c["console_scripts"].split(),
        "nbdev": [f"{c['lib_name']}={c['lib_name']}._modidx:d"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Intended Audience :: Science/Research",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    zip_safe=False,
)
