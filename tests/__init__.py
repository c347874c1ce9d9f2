from . import typechecker as typechecker
