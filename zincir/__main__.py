from ._cli import main

main(prog_name="zincir")
